"""A real clean install: ``pip install .`` into a fresh virtual environment (no system or dev
site-packages), then the README's first example run from outside the repository, so the installed
copy is the one imported. 1.5 to 3 minutes on the 2-core VM (mostly torch and the other
wheels being unpacked); ``pytest -m "not install"`` leaves it out."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
ROOT = Path(__file__).resolve().parents[1]


def _run(args, **kwargs):
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.install
@pytest.mark.slow
def test_pip_install_in_a_clean_venv_runs_the_readme_example(tmp_path):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # Install from a copy of what a source distribution holds, so the checkout gets no build/.
    src = tmp_path / "src"
    shutil.copytree(ROOT / "fedgp", src / "fedgp", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    # A clean process environment for everything below. An inherited PYTHONPATH holding the dev
    # venv (Flower's Ray simulation backend writes sys.path into os.environ["PYTHONPATH"]; in
    # `make test` this once made pip count gpytorch as installed and skip it) must not leak in.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", MPLBACKEND="Agg", XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("FEDGP_DATA", None)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], env=env)
    python = venv / "bin" / "python"
    # The pinned CPU torch and friends, as `make` installs them; no extras: the core must suffice.
    log = _run([python, "-m", "pip", "install", "-c", ROOT / "constraints.txt", src], timeout=1800, env=env)
    # Every core dependency must be there, named with pip's own account of the install if not.
    listing = _run([python, "-m", "pip", "list", "--format=freeze"], env=env).lower()
    wanted = [re.split(r"[<>=!~ \[]", req, maxsplit=1)[0].lower() for req in project["dependencies"]]
    missing = [name for name in wanted if f"{name}==" not in listing]
    assert not missing, f"pip install . left out {missing}:\n{log[-3000:]}\n{listing}"

    work = tmp_path / "elsewhere"
    work.mkdir()
    block = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    (work / "readme.py").write_text(
        block
        + "\nimport importlib.metadata as md\n"
        + "print('FILE', fedgp.__file__)\nprint('VERSION', fedgp.__version__)\n"
        + "dist = md.distribution(fedgp.DISTRIBUTION)\n"
        + "print('LICENSE', dist.read_text('licenses/LICENSE').splitlines()[0])\n"
        + "print('MEAN', tuple(mean.shape), bool((var > 0).all()), len(result.history))\n"
        + "from fedgp.datasets import registry\n"
        + "print('REGISTRY', registry.default_registry().entry('cmapss', 'train_FD001.txt').size)\n"
        + "print('ROOT', registry.data_root()[0])\n"
    )
    out = dict(
        line.split(" ", 1)
        for line in _run([python, "readme.py"], cwd=work, env=env).splitlines()
        if " " in line
    )
    assert Path(out["FILE"]).is_relative_to(venv), out["FILE"]  # the installed copy, not the checkout
    assert out["VERSION"] == project["version"]  # from the installed metadata
    assert out["LICENSE"] == "MIT License"
    assert out["MEAN"] == "(5,) True 100"
    # The wheel carries the data registry, and an installed copy keeps its data in the user's cache.
    assert int(out["REGISTRY"]) > 0
    assert out["ROOT"] == str(tmp_path / "cache" / "fedgp" / "datasets")
    assert (
        _run([venv / "bin" / "fedgp", "--version"], cwd=work, env=env).strip()
        == f"fedgp {project['version']}"
    )
    assert project["name"] == "fedgp-gpytorch"


def test_the_readmes_install_from_a_clone_writes_nothing_into_the_checkout(tmp_path):
    """The README's line for installing a clone elsewhere builds from a temporary copy of the
    committed HEAD (``pip install -c constraints.txt "git+file://$PWD"``): no ``build/`` in the
    checkout, whose stale files could reach a later wheel. (``pip wheel`` with the same URL: the
    build, without installing torch again.)"""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the README's line installs a clone")
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -c constraints.txt "git+file://$PWD"' in readme
    before = {p.name for p in ROOT.iterdir()}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path,
          f"git+file://{ROOT}"], env=env, timeout=600)  # fmt: skip
    assert [p.name for p in tmp_path.glob("fedgp_gpytorch-*.whl")], "no wheel was built"
    assert {p.name for p in ROOT.iterdir()} - before == set(), "the build wrote into the checkout"
