"""The package's import graph keeps its shape: no circles, and no import from a lower layer to a higher.

DESIGN.md's layers run data → model → strategy → engine → run; every module of fedgp is placed in
one of the layers below by the top-level folder (or module) that holds it, one folder one layer,
and a module may import only modules of its own layer or lower ones. Imports inside
``if TYPE_CHECKING:`` are annotations, not dependencies, and do not count; every other import
does, at module level or inside a function.
A package's ``__init__`` re-exporting its own modules is not a dependency either.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedgp"

#: Lowest first, one row per top-level folder or module of ``fedgp`` (a module's own folder decides its
#: layer: no row carves a folder in two). Two rows group top-level modules of one concern: the plumbing
#: every layer shares, and the front doors. Within a row, modules may import each other (the circle test
#: still applies).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "plumbing",
        (
            "fedgp.errors",
            "fedgp.defaults",
            "fedgp.version",
            "fedgp.files",
            "fedgp.rng",
            "fedgp.checks",
            "fedgp.plotting",
        ),  # fmt: skip
    ),
    # Clients, federations, partitions, owner tables: the ground floor, no model.
    ("data", ("fedgp.data",)),
    # The papers' real data sets: files read into data's clients, still no model.
    ("datasets", ("fedgp.datasets",)),
    # A model needs its clients' data; a GPyTorch or BoTorch model of one client needs only the model.
    ("models", ("fedgp.models",)),
    ("export", ("fedgp.export",)),
    # Synthetic federations are draws from a model: they sit above it.
    ("synthetic", ("fedgp.synthetic",)),
    ("baselines", ("fedgp.baselines",)),
    ("transforms", ("fedgp.summaries", "fedgp.transformed", "fedgp.transforms")),
    ("messages", ("fedgp.messages",)),
    ("clustering", ("fedgp.clustering",)),
    ("aggregators", ("fedgp.aggregators",)),
    ("strategies", ("fedgp.strategies",)),
    ("presets", ("fedgp.presets",)),
    ("attacks", ("fedgp.attacks",)),
    ("engines", ("fedgp.engines",)),
    ("run", ("fedgp.run",)),
    # A model folder's files: what fit --out and the Flower app write of a FitResult.
    ("layout", ("fedgp.layout",)),
    # Flower's ClientApp and grid engine, and the ServerApps that run a fit: one folder above the run.
    ("flower", ("fedgp.flower",)),
    ("testing", ("fedgp.testing",)),
    # Federated BO: owners proposing on fitted federations, so above the run.
    ("bo", ("fedgp.bo",)),
    ("experiments", ("fedgp.experiments",)),
    (
        "front doors",
        (
            "fedgp.sklearn",
            "fedgp.commands",
            "fedgp._cli_flower",
            "fedgp._cli_training",
            "fedgp._cli_memory",
            "fedgp.cli",
        ),
    ),
    # The top-level face: nothing inside the package imports it.
    ("face", ("fedgp",)),
]


def top_level(module: str) -> str:
    """The top-level folder or module of fedgp that holds ``module`` (``fedgp`` for the face)."""
    return ".".join(module.split(".")[:2])


#: Each top-level folder or module, and the rank of its row.
RANK = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> int:
    rank = RANK.get(top_level(module))
    assert rank is not None, f"{module} is in no layer of tests/test_layers.py: place {top_level(module)}"
    return rank


def _target(name: str) -> str | None:
    """The fedgp module an import names (a name imported from a module resolves to the module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """The fedgp modules ``module`` imports, outside ``if TYPE_CHECKING:`` blocks."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names = [f"{origin}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            target = _target(name)
            if target and target != module and target.startswith("fedgp"):
                found.add(target)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


def test_a_row_names_whole_folders():
    """A row names top-level folders or modules, each once: a folder is one layer, never split."""
    names = [name for _, row in LAYERS for name in row]
    assert len(names) == len(set(names)), "a folder or module in two rows"
    assert all(top_level(name) == name for name in names), "a row names a module inside a folder"
    assert {top_level(m) for m in MODULES} == set(names), "a row names no folder or module of fedgp"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a module to a module of a higher layer."""
    upward = []
    for module, targets in graph.items():
        face = MODULES[module].name == "__init__.py"
        for target in targets:
            if face and target.startswith(module + "."):
                continue  # a package's face re-exporting its own modules
            low, high = layer_of(module), layer_of(target)
            if high > low:
                upward.append(f"{module} ({LAYERS[low][0]}) imports {target} ({LAYERS[high][0]})")
    return sorted(upward)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_a_higher_layer():
    upward = upward_imports(GRAPH)
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def test_no_import_circles():
    found = circles(GRAPH)
    assert not found, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_see_a_circle_and_an_upward_import():
    """The two checks fail on a broken graph: run them on a doctored copy."""
    doctored = {k: set(v) for k, v in GRAPH.items()}
    doctored["fedgp.models.spec"].add("fedgp.run.loop")
    doctored["fedgp.errors"].add("fedgp.version")
    doctored["fedgp.version"].add("fedgp.errors")
    assert any(
        line.startswith("fedgp.models.spec (models) imports fedgp.run.loop")
        for line in upward_imports(doctored)
    )
    assert ["fedgp.errors", "fedgp.version"] in circles(doctored)


# -- sizes ---------------------------------------------------------------------------------------------

#: Functions whose length is the algorithm: one compiled kernel each (their docstring says so).
COMPILED_KERNELS = {
    ("fedgp.engines.fused", "__init__"),
    ("fedgp.engines.fused", "local_round"),
    ("fedgp.engines.triton_round", "_round"),  # one GPU program (its docstring says why)
}


def test_no_module_over_600_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"modules over 600 lines (split them by concern): {long}"


def test_no_function_over_80_lines_but_the_compiled_kernels():
    long = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80 and (module, node.name) not in COMPILED_KERNELS:
                    long.append(f"{module}.{node.name}: {lines} lines")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)
