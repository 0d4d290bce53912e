"""The public API: every public module has ``__all__``, every name in it a docstring, and every
subpackage is an attribute of ``fedgp`` without being imported first (lazily, PEP 562)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import pkgutil
import subprocess
import sys
import types
from functools import cache
from pathlib import Path

import pytest

import fedgp

PACKAGE = Path(fedgp.__file__).parent


def public_modules() -> list[str]:
    """Every module of the package whose dotted name has no part starting with ``_``."""
    names = ["fedgp"]
    for info in pkgutil.walk_packages([str(PACKAGE)], "fedgp."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def top_level_modules() -> set[str]:
    """The public modules and subpackages directly under ``fedgp/``, from the files on disk."""
    return {info.name for info in pkgutil.iter_modules([str(PACKAGE)]) if not info.name.startswith("_")}


@cache
def documented_assignments(module_name: str) -> dict[str, bool]:
    """``name -> has a docstring`` for the module-level assignments of a module's source. A value's
    docstring is the string literal right after ``NAME = ...`` or the ``#:`` comment lines right
    above it (Sphinx's convention; ``docs/hooks/griffe_comments.py`` shows those in the API docs)."""
    source = inspect.getsource(importlib.import_module(module_name))
    lines = source.splitlines()
    body = ast.parse(source).body
    found: dict[str, bool] = {}
    for statement, following in zip(body, [*body[1:], None]):
        if isinstance(statement, ast.Assign):
            targets = [t for target in statement.targets for t in ast.walk(target) if isinstance(t, ast.Name)]
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            targets = [statement.target]
        else:
            continue
        literal_after = (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
            and bool(following.value.value.strip())
        )
        above = lines[statement.lineno - 2].strip() if statement.lineno >= 2 else ""
        comment_above = above.startswith("#:") and len(above) > 2
        for target in targets:
            found[target.id] = found.get(target.id, False) or literal_after or comment_above
    return found


def data_docstring_found(name: str, value) -> bool:
    """Whether a module-level value (a constant, a table, a type alias) is documented where it is
    assigned: in any public module that assigns ``name`` to this very object."""
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        if module.__dict__.get(name) is value and name in documented_assignments(module_name):
            if documented_assignments(module_name)[name]:
                return True
    return False


def test_every_public_module_has_a_docstring_and_all():
    for name in public_modules():
        module = importlib.import_module(name)
        assert inspect.getdoc(module), f"{name} has no module docstring"
        exported = getattr(module, "__all__", None)
        assert isinstance(exported, list | tuple), f"{name} has no __all__"
        assert all(isinstance(n, str) for n in exported), f"{name}.__all__ holds a non-string"
        missing = [n for n in exported if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ names {missing}, which {name} does not define"
        assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"


def test_every_public_name_has_a_docstring():
    undocumented = []
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type | types.ModuleType) or inspect.isroutine(value):
                if not (value.__doc__ or "").strip():
                    undocumented.append(f"{module_name}.{name}")
            elif not data_docstring_found(name, value):
                undocumented.append(f"{module_name}.{name} (a value: a `#:` comment above it)")
    assert not undocumented, "public names without a docstring:\n" + "\n".join(undocumented)


def test_public_methods_of_public_classes_have_docstrings():
    """A class's own public methods and properties say what they do (inherited docstrings count)."""
    undocumented, seen = [], set()
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            cls = getattr(module, name)
            if not isinstance(cls, type) or not cls.__module__.startswith("fedgp") or cls in seen:
                continue
            seen.add(cls)
            for attr, raw in vars(cls).items():
                if attr.startswith("_"):
                    continue
                func = raw.fget if isinstance(raw, property) else getattr(raw, "__func__", raw)
                if not inspect.isfunction(func) or (func.__doc__ or "").strip():
                    continue
                inherited = any(
                    (getattr(getattr(base, attr, None), "__doc__", None) or "").strip()
                    for base in cls.__mro__[1:]
                )
                if not inherited:
                    undocumented.append(f"{cls.__module__}.{cls.__qualname__}.{attr}")
    assert not undocumented, "public methods without a docstring:\n" + "\n".join(undocumented)


def public_functions() -> dict[str, types.FunctionType]:
    """``dotted name -> function`` for every public function in a public module's ``__all__`` and
    every public method (classmethods, staticmethods and property getters included) of a public
    class there, inherited ones too, as long as fedgp defines it; ``__init__`` and other ``_`` names
    are not public."""
    found: dict[str, types.FunctionType] = {}
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type):
                if not value.__module__.startswith("fedgp"):
                    continue
                for attr in dir(value):
                    if attr.startswith("_"):
                        continue
                    raw = inspect.getattr_static(value, attr)
                    func = raw.fget if isinstance(raw, property) else getattr(raw, "__func__", raw)
                    if inspect.isfunction(func) and func.__module__.startswith("fedgp"):
                        found.setdefault(f"{func.__module__}.{func.__qualname__}", func)
            else:
                func = getattr(value, "__func__", value)  # fedgp.load is FitResult.load
                if inspect.isfunction(func) and func.__module__.startswith("fedgp"):
                    found.setdefault(f"{func.__module__}.{func.__qualname__}", func)
    return found


def test_every_public_function_and_method_has_a_return_annotation():
    """A reader (and a type checker, and the API docs) sees what each public callable returns."""
    functions = public_functions()
    assert len(functions) > 500  # the walk reaches the methods, not only the module-level functions
    missing = [
        f"{name} ({inspect.getsourcefile(func)}:{func.__code__.co_firstlineno})"
        for name, func in sorted(functions.items())
        if inspect.signature(func).return_annotation is inspect.Signature.empty
    ]
    assert not missing, "public functions without a return annotation:\n" + "\n".join(missing)


def _annotation_names(module: types.ModuleType) -> tuple[dict, set[str]]:
    """A module's globals plus the names its ``if TYPE_CHECKING:`` block imports, and the names of
    that block whose package is not installed (an extra such as botorch)."""
    names, absent = dict(vars(module)), set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for statement in node.body:
                try:
                    exec(compile(ast.Module([statement], []), module.__name__, "exec"), names)
                except ImportError:
                    absent.update(alias.asname or alias.name.split(".")[0] for alias in statement.names)
    return names, absent


def test_every_public_return_annotation_names_real_types():
    """The annotations are postponed strings (``from __future__ import annotations``): each must
    evaluate, in its module with its ``TYPE_CHECKING`` imports, to a type (not a misspelt name)."""
    broken, namespaces = [], {}
    for name, func in sorted(public_functions().items()):
        annotation = func.__annotations__.get("return")
        if not isinstance(annotation, str):
            continue
        if func.__module__ not in namespaces:
            namespaces[func.__module__] = _annotation_names(sys.modules[func.__module__])
        names, absent = namespaces[func.__module__]
        try:
            eval(annotation, names)
        except NameError as err:
            if err.name not in absent:
                broken.append(f"{name}: -> {annotation} ({err})")
        except Exception as err:  # reported with the name
            broken.append(f"{name}: -> {annotation} ({type(err).__name__}: {err})")
    assert not broken, "return annotations that do not evaluate:\n" + "\n".join(broken)


def test_every_top_level_module_is_exposed():
    """A new module under ``fedgp/`` must be added to the lazily exposed list (or be private)."""
    assert top_level_modules() == set(fedgp._SUBMODULES)
    assert set(fedgp.__all__) <= set(dir(fedgp))
    assert set(fedgp._SUBMODULES) <= set(dir(fedgp))


SUBPACKAGES_IN_A_FRESH_PROCESS = """
import json, sys, types
import fedgp
report = {"torch_after_import": "torch" in sys.modules, "modules": {}}
for name in fedgp._SUBMODULES:
    was_imported = f"fedgp.{name}" in sys.modules
    value = getattr(fedgp, name)
    report["modules"][name] = {
        "was_imported": was_imported,
        "is_the_module": isinstance(value, types.ModuleType) and value is sys.modules[f"fedgp.{name}"],
    }
report["fit_is_function"] = isinstance(fedgp.fit, types.FunctionType)
report["fit_is_run_fit"] = fedgp.fit is sys.modules["fedgp.run"].fit
report["load_is_fit_result_load"] = (
    fedgp.load == fedgp.FitResult.load and fedgp.FitResult is fedgp.run.FitResult
)
print(json.dumps(report))
"""


def test_subpackages_are_attributes_in_a_fresh_process():
    out = subprocess.run(
        [sys.executable, "-c", SUBPACKAGES_IN_A_FRESH_PROCESS],
        capture_output=True,
        text=True,
        check=True,
        cwd=PACKAGE.parent,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["torch_after_import"] is False  # import fedgp imports nothing heavy
    # the first subpackage asked for was not imported by `import fedgp`: the lazy path ran
    first = fedgp._SUBMODULES[0]
    assert report["modules"][first]["was_imported"] is False
    bad = [name for name, r in report["modules"].items() if not r["is_the_module"]]
    assert not bad, f"fedgp.<name> is not the subpackage for {bad}"
    assert report["fit_is_function"] and report["fit_is_run_fit"] and report["load_is_fit_result_load"]


@pytest.mark.parametrize("name", ["baselines", "plotting", "experiments"])
def test_named_subpackage_first_in_a_fresh_process(name):
    """The issue's own examples: ``fedgp.baselines`` etc. raised AttributeError until imported."""
    code = f"import sys, fedgp; assert 'fedgp.{name}' not in sys.modules; print(fedgp.{name}.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"fedgp.{name}"


def test_fit_is_the_run_function_whatever_is_imported_first():
    """``fedgp.fit`` is :func:`fedgp.run.fit` (there is no module ``fedgp.fit`` to shadow it), and the
    top-level names are the objects of :mod:`fedgp.run` whether ``fedgp.run`` is imported first or not."""
    for first in ("fedgp.run, fedgp", "fedgp, fedgp.run"):
        code = (
            f"import {first}, sys, types; from fedgp.run import FitResult, fit, load; "
            "assert isinstance(fedgp.fit, types.FunctionType) and fedgp.fit is fit, fedgp.fit; "
            "assert fedgp.FitResult is FitResult and fedgp.load == load == FitResult.load; "
            "assert 'fedgp.fit' not in sys.modules; print('ok')"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_fit_takes_at_most_ten_parameters_and_run_takes_the_same():
    """A new concern is a new option object or a wrapper of the strategy, not another keyword of
    ``fit`` (issue 50: client-level DP is ``ClientDP(strategy, ...)``, not ``privacy=``); ``Run``, the
    loop ``fit`` drives, takes what ``fit`` takes."""
    fit = inspect.signature(fedgp.fit).parameters
    assert len(fit) <= 10, list(fit)
    run = inspect.signature(fedgp.run.Run).parameters
    assert [(p.name, p.kind, p.default) for p in run.values()] == [
        (p.name, p.kind, p.default) for p in fit.values()
    ]
    assert "privacy" not in fit


#: Modules that moved in the run-layer refactor (issue 28), with no shim left behind at the old path.
MOVED_WITHOUT_SHIMS = [
    "fedgp.fit",
    "fedgp.rounds",
    "fedgp.stopping",
    "fedgp.progress",
    "fedgp.state_codec",
    "fedgp.engines.checkpoint",
    "fedgp.engines.fingerprint",
    "fedgp.engines.remote",
    "fedgp.export.saved",
    "fedgp.export.spec_io",
    "fedgp.strategies.aggregators",
]


@pytest.mark.parametrize("name", MOVED_WITHOUT_SHIMS)
def test_moved_modules_are_gone_not_shimmed(name):
    assert importlib.util.find_spec(name) is None, f"{name} still exists"
    assert name not in public_modules()


def test_every_error_and_warning_is_a_fedgp_one_and_importable_from_fedgp():
    """``fedgp.errors`` holds them all; each is ``fedgp.<Name>`` and derives from ``FedGPError`` (or
    ``FedGPWarning``), so ``except fedgp.FedGPError`` catches anything fedgp refused on purpose."""
    from fedgp.errors import FedGPError, FedGPWarning

    assert set(fedgp.errors.__all__) <= set(fedgp.__all__)
    for name in fedgp.errors.__all__:
        cls = getattr(fedgp.errors, name)
        assert getattr(fedgp, name) is cls, name
        assert issubclass(cls, FedGPWarning if issubclass(cls, Warning) else FedGPError), name
    strays = []
    for module_name in public_modules():
        for value in vars(importlib.import_module(module_name)).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__.startswith("fedgp")
                and not value.__name__.startswith("_")  # internal signals and mixins, never raised to you
                and not issubclass(value, (FedGPError, FedGPWarning))
            ):
                strays.append(f"{value.__module__}.{value.__qualname__}")
    assert not strays, f"error classes outside fedgp.errors' hierarchy: {sorted(set(strays))}"


def test_a_missing_extra_is_named():
    """Without Flower installed, ``fedgp.flower`` says which extra to install."""
    code = (
        "import sys; sys.modules['flwr'] = None\n"  # as if flwr were not installed
        "import fedgp\n"
        "try:\n    fedgp.flower\nexcept ModuleNotFoundError as err:\n    print(err)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr
    assert "fedgp.flower needs 'flwr'" in out.stdout and "fedgp-gpytorch[flower]" in out.stdout


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        fedgp.nonexistent  # noqa: B018
    assert not hasattr(fedgp, "sklearn_typo")
