"""The README's API example runs exactly as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_starts_with_what_fedgp_is_and_pip_install():
    """What fedgp is, then ``pip install``; the developers' two commands under "From a clone"."""
    text = README.read_text()
    assert text.split("\n\n", 2)[1].startswith("fedgp fits Gaussian-process surrogates")
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert all(c.startswith("pip install") for c in commands), commands
    clone = re.search(r"```bash\n(.*?)```", _section("## From a clone"), re.S).group(1)
    assert [line.split("#")[0].strip() for line in clone.strip().splitlines()] == ["make demo", "make test"]
    assert 'pip install -c constraints.txt "git+file://$PWD"' in _section("## From a clone")


def test_the_readme_names_every_extra():
    import tomllib

    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    install = README.read_text().split("**Install.**", 1)[1].split("\n\n", 1)[0]
    missing = [name for name in extras if f"`{name}`" not in install]
    assert not missing, f"the README's Install paragraph does not name the extras {missing}"


def test_readme_is_short_and_starts_with_pip():
    """A newcomer reads what fedgp is and how to install it on the first screen; the rest is in the docs."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    assert any(line.startswith("pip install fedgp-gpytorch") for line in lines[:40])
    in_code, wide = False, []
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_code = not in_code
        elif in_code and len(line) > 100:
            wide.append(f"README.md:{number} ({len(line)} characters)")
    assert not wide, wide


def test_readme_python_example_runs_as_written(capsys):
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert len(block.strip().splitlines()) <= 10
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    result = namespace["result"]
    assert namespace["mean"].shape == (5,) and bool((namespace["var"] > 0).all())
    assert len(result.history) == 100
    # the example is also a sanity check: the rounds bring the test RMSE close to the noise level
    assert result.history["test_rmse_mean"].iloc[-1] < result.history["test_rmse_mean"].iloc[0]


@pytest.mark.slow
def test_robust_personalised_example_runs_as_written():
    """The Robust aggregation guide's gradient-clustering example (its docs test skips it: minutes)."""
    text = (
        (README.parent / "docs" / "guides" / "robust.md")
        .read_text()
        .split("## Personalised and robust", 1)[1]
    )
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {"fedgp": __import__("fedgp")}
    exec(compile(block, "docs/guides/robust.md", "exec"), namespace)
    result, data = namespace["result"], namespace["data"]
    assert result.state.batch_shape == (40,) and sorted(result.attackers) == list(data.extra)
    table = result.evaluate()
    honest = table[~table["client"].isin(result.attackers)]
    assert honest["rmse"].mean() < 0.5  # local training alone: about 0.8 on these clients


def test_readme_own_data_example_runs_as_written():
    text = README.read_text().split("## Your own data", 1)[1]
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    result, y = namespace["result"], namespace["y"]
    assert result.transforms["outcome"].startswith("standardize, mean 146.693, sd 75.3018")
    mean = namespace["mean"]
    assert list(result.evaluate()["client"])[:2] == ["clinic-0", "clinic-1"]  # ids= names the owners
    assert mean.shape == (3,) and 25 <= float(mean.mean()) <= 346  # original units
    assert 0.85 <= result.evaluate()["coverage95"].mean() <= 1.0 and y.min() == 25


def test_readme_save_load_botorch_example_runs_as_written():
    pytest.importorskip("botorch")
    import torch

    text = README.read_text().split("### Save, load and BoTorch", 1)[1]
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    result, loaded, newcomer = namespace["result"], namespace["loaded"], namespace["newcomer"]
    assert loaded.state.allclose(result.state, rtol=0)
    assert namespace["draws_f"].shape == (3, 4) and namespace["pred"].covariance_f.shape == (4, 4)
    X = torch.rand(3, 2, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(namespace["gp"](X).mean, result.posterior(X, newcomer).mean, atol=1e-10)
    x_next = namespace["x_next"]
    assert x_next.shape == (1, 2) and bool(((x_next >= 0) & (x_next <= 1)).all())


def _section(title: str) -> str:
    return README.read_text().split(title, 1)[1].split("\n## ", 1)[0]


def test_readme_files_commands_run_as_written(tmp_path, monkeypatch, capsys):
    """The two commands of "Data in files", on the table the guide makes (docs/guides/...)."""
    import shlex

    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_diabetes

    from fedgp.cli import main

    monkeypatch.chdir(tmp_path)
    guide = (README.parent / "docs" / "guides" / "files-and-sklearn.md").read_text()
    make_table = re.search(r"```python\n(.*?)```", guide, re.S).group(1)
    exec(compile(make_table, "files-and-sklearn.md", "exec"), {"np": np, "load_diabetes": load_diabetes})
    commands = re.search(r"```bash\n(.*?)```", _section("### Data in files, and scikit-learn"), re.S).group(1)
    for line in commands.strip().splitlines():
        argv = shlex.split(line)
        assert argv[0] == "fedgp"
        assert main([*argv[1:], "--quiet"]) == 0
    metrics = pd.read_csv(tmp_path / "model" / "metrics.csv")
    assert sorted(metrics["owner"]) == ["centre", "east", "north", "south", "west"]
    assert (metrics["split"] == "held-out").all() and metrics["n_test"].sum() == 100
    pred = pd.read_csv(tmp_path / "clinics-predictions" / "predictions.csv")
    assert len(pred) == 42 and ((pred["lower95"] < pred["mean"]) & (pred["mean"] < pred["upper95"])).all()
    assert "wrote clinics-predictions/predictions.csv" in capsys.readouterr().out


def test_readme_sklearn_example_runs_as_written(capsys):
    block = re.search(r"```python\n(.*?)```", _section("### Data in files, and scikit-learn"), re.S).group(1)
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    assert namespace["mean"].shape == namespace["std"].shape == (142,)
    assert f"R² {float(capsys.readouterr().out):.3f}" in block  # the number the README quotes


def test_every_pip_install_of_fedgp_names_the_distribution():
    """``fedgp`` on PyPI is an unrelated package: every line that installs this one, in the README,
    the docs, the examples and the package's own messages, names ``fedgp-gpytorch``."""
    root = README.parent
    texts = [README, *(root / "docs").rglob("*.md"), *(root / "fedgp").rglob("*.py")]
    texts += [*(root / "examples").rglob("*")]
    wrong = []
    for path in texts:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in re.finditer(r"pip install\s+(?:-U\s+)?['\"]?(fedgp[\w.\[\]-]*)", line):
                warning = "unrelated" in line  # the README's line saying why not `pip install fedgp`
                if not match.group(1).startswith("fedgp-gpytorch") and not warning:
                    wrong.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not wrong, "pip install lines naming the wrong distribution:\n" + "\n".join(wrong)
