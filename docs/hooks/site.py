"""MkDocs hook: the pages that are generated at build time, so that they cannot go stale.

* **API reference**: one page per public subpackage or module (``api/<name>.md``, plus
  ``api/fedgp.md`` for the top level and ``api/plumbing.md`` for the shared infrastructure), each a list of
  mkdocstrings ``:::`` blocks: the subpackage with the names in its ``__all__``, then each of its
  public modules with the names of its ``__all__`` that the subpackage does not re-export. Every
  name in every public ``__all__`` is shown once. The names are read from the source (``ast``), so
  the build imports nothing heavy.
* **Notebooks**: ``notebooks/*.ipynb`` of the repository appear under ``notebooks/`` of the site;
  mkdocs-jupyter renders them with their committed outputs, without executing them.
* **Reproducing the papers**: in ``reproducing.md``, ``<!-- verdicts: SECTION -->`` becomes the
  table of our numbers beside the paper's with the verdict, read from ``results/verdicts.csv``;
  ``<!-- results-file: NAME.md -->`` becomes that committed results file, collapsed.
* **Changelog**: ``changelog.md`` is the repository's ``CHANGELOG.md``, appended to the navigation
  as its last entry unless ``mkdocs.yml``'s ``nav`` already lists it.
* **Version**: the site's name and footer carry the version of ``pyproject.toml`` (what
  ``fedgp.__version__`` reports once installed).

Math is converted to MathML by the other hook, ``mathml.py``.
"""

from __future__ import annotations

import ast
import csv
import re
from pathlib import Path

import tomllib
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fedgp"
RESULTS = ROOT / "results"

#: Subpackages and modules with a page of their own, in the navigation's order. A public module of
#: fedgp that is in neither list fails the build (see ``_check_coverage``), so a new one cannot go
#: undocumented.
PAGES = (
    "data",
    "synthetic",
    "datasets",
    "models",
    "messages",
    "strategies",
    "aggregators",
    "attacks",
    "clustering",
    "engines",
    "run",
    "flower",
    "transforms",
    "transformed",
    "summaries",
    "defaults",
    "export",
    "baselines",
    "bo",
    "experiments",
    "plotting",
    "sklearn",
    "errors",
    "testing",
)
#: Infrastructure the layers share, documented together on ``api/plumbing.md``.
PLUMBING = ("rng", "checks", "files", "layout", "cli", "commands", "presets", "version")


# --------------------------------------------------------------------------------------------------
# API reference


def _module_file(dotted: str) -> Path:
    path = ROOT.joinpath(*dotted.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _tree(dotted: str) -> ast.Module:
    return ast.parse(_module_file(dotted).read_text(encoding="utf-8"))


def exported(dotted: str) -> list[str]:
    """The ``__all__`` of a module, from its source: literal names, and ``*sub.__all__`` of its own
    submodules spliced in (a module without ``__all__`` exports nothing here)."""
    for node in _tree(dotted).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            names = []
            for element in node.value.elts:
                if isinstance(element, ast.Constant):
                    names.append(element.value)
                elif isinstance(element, ast.Starred) and isinstance(element.value, ast.Attribute):
                    names += exported(f"{dotted}.{element.value.value.id}")
            return names
    return []


def is_submodule(package: str, name: str) -> bool:
    folder = ROOT.joinpath(*package.split("."))
    return (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file()


def reexported(package: str) -> set[str]:
    """The names a package's page shows at the package's level. A name that is also one of its
    submodules (``fedgp.clustering.kmeans``) is the submodule to griffe: the object is shown under
    the submodule instead."""
    return {n for n in exported(package) if not is_submodule(package, n)}


#: A Sphinx role in a docstring (``:func:`fedgp.fit```), as docs/hooks/griffe_fedgp.py reads them.
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc|const):`(~?)([^`<]+?)`")


def _role_target(target: str, module: str) -> str:
    """The API entry a role names: a name relative to ``module`` made absolute, and a top-level name
    (``fedgp.fit``) the entry of the subpackage that re-exports it (``fedgp.run.fit``)."""
    target = target.strip().rstrip("()")
    if not target.startswith("fedgp."):
        target = f"{module}.{target.lstrip('.')}"
    package, _, name = target.rpartition(".")
    if package == "fedgp" and not is_submodule("fedgp", name):
        for page in PAGES:
            if name in reexported(f"fedgp.{page}"):
                return f"fedgp.{page}.{name}"
    return target


def _roles_as_markdown(text: str, module: str) -> str:
    """A docstring line's Sphinx roles as (optional) cross-references, the rest as Markdown: the API
    pages get theirs from the griffe extension, the generated index reads the source itself."""

    def reference(match: re.Match) -> str:
        tilde, target = match.groups()
        label = target.strip().split(".")[-1] if tilde else target.strip().lstrip(".")
        identifier = _role_target(target, module)
        return f'<autoref identifier="{identifier}" optional><code>{label}</code></autoref>'

    return ROLE.sub(reference, text)


def summary(dotted: str) -> str:
    """The first line of a module's docstring, its roles as cross-references."""
    doc = ast.get_docstring(_tree(dotted)) or ""
    return _roles_as_markdown(doc.strip().splitlines()[0], dotted) if doc.strip() else ""


def submodules(dotted: str) -> list[str]:
    """A package's public modules and subpackages, depth first, in name order."""
    folder = ROOT.joinpath(*dotted.split("."))
    if not folder.is_dir():
        return []
    found = []
    for child in sorted(folder.iterdir()):
        name = child.stem
        if name.startswith("_") or name == "__pycache__":
            continue
        if child.is_dir() and (child / "__init__.py").exists():
            found += [f"{dotted}.{name}", *submodules(f"{dotted}.{name}")]
        elif child.suffix == ".py":
            found.append(f"{dotted}.{name}")
    return found


def _block(dotted: str, members: list[str] | None, heading_level: int = 2) -> str:
    lines = [f"::: {dotted}", "    options:", f"      heading_level: {heading_level}"]
    if members and any(name.startswith("_") for name in members):  # ``__version__``: listed, so shown
        lines.append("      filters: []")
    if members == []:
        lines.append("      members: false")
    elif members is not None:
        lines.append("      members:")
        lines += [f"        - {name}" for name in members]
    return "\n".join(lines) + "\n"


def api_page(name: str) -> str:
    """``api/<name>.md``: the subpackage with its ``__all__``, then each public module below it with
    the names of its ``__all__`` that no package above it (on this page) re-exports."""
    dotted = f"fedgp.{name}"
    root = [n for n in exported(dotted) if n in reexported(dotted)]
    parts = [_block(dotted, root if exported(dotted) else None, 1)]  # the root heading is the title
    for module in submodules(dotted):
        above = [".".join(module.split(".")[:k]) for k in range(2, module.count(".") + 1)]
        shown = set().union(*(reexported(package) for package in above))
        members = [n for n in exported(module) if n not in shown and n in reexported(module)]
        if members:
            parts.append(_block(module, members, 2))
    return "\n".join(parts)


def plumbing_page() -> str:
    intro = (
        "# Plumbing\n\nModules the layers share: the seeded random streams, the settings checks, "
        "durable file writes, the `fedgp` command line and its presets, and the installed version.\n"
    )
    return intro + "\n".join(
        _block(f"fedgp.{name}", exported(f"fedgp.{name}") or None, 2) for name in PLUMBING
    )


def top_level_page() -> str:
    return (
        _block("fedgp", [], 1)
        + "\nThe top level holds `fedgp.fit`, `fedgp.FitResult` and `fedgp.load`, which live in "
        "[fedgp.run](run.md) (`fedgp.run.fit`, `fedgp.run.FitResult`, `fedgp.run.load`); "
        "`fedgp.GPSpec` and `fedgp.HyperState`, documented in [fedgp.models](models.md); and every "
        "error and warning class (`fedgp.FedGPError`, `fedgp.ConvergenceWarning`, ...), which live in "
        "[fedgp.errors](errors.md). The version is [fedgp.version](plumbing.md#fedgp.version).\n\n"
        + _block("fedgp.DISTRIBUTION", None, 2)
    )


def api_index() -> str:
    rows = ["| module | what it holds |", "|---|---|"]
    for name in PAGES:
        rows.append(f"| [`fedgp.{name}`]({name}.md) | {summary(f'fedgp.{name}')} |")
    rows.append(
        f"| [plumbing](plumbing.md): {', '.join(f'`{n}`' for n in PLUMBING)} | shared infrastructure |"
    )
    return (
        "# API reference\n\n"
        "Generated from the docstrings at build time: every name in every public module's `__all__`. "
        "`import fedgp` is enough for all of them: each subpackage is imported on first use.\n\n"
        "[`fedgp`](fedgp.md) itself holds `fit`, `FitResult` and `load` (from [`fedgp.run`](run.md)), "
        "`GPSpec` and `HyperState` (from [`fedgp.models`](models.md)) and every error and warning class "
        "(from [`fedgp.errors`](errors.md)).\n\n" + "\n".join(rows) + "\n"
    )


def _check_coverage() -> None:
    on_disk = {
        p.stem if p.suffix == ".py" else p.name
        for p in PACKAGE.iterdir()
        if not p.name.startswith("_") and (p.suffix == ".py" or (p / "__init__.py").exists())
    }
    missing = on_disk - set(PAGES) - set(PLUMBING)
    if missing:
        raise RuntimeError(
            f"docs/hooks/site.py: fedgp module(s) {sorted(missing)} have no API page: add them to PAGES "
            "(and to the nav in mkdocs.yml) or to PLUMBING"
        )


# --------------------------------------------------------------------------------------------------
# Reproducing the papers: verdict tables from results/verdicts.csv


def _fmt(value: str) -> str:
    """Three significant figures, as the papers print them."""
    if value in ("", "nan"):
        return ""
    return f"{float(value):.3g}"


def _number(value: str, std: str) -> str:
    spread = "" if std in ("", "nan") else f"{float(std):.2g}"  # a spread to two figures
    return f"{_fmt(value)} ± {spread}" if spread else _fmt(value)


VERDICT_STYLE = {
    "reproduced": "reproduced",
    "better": "**better**",
    "worse": "worse",
    "different protocol": "*different protocol*",
}


def verdict_table(section: str) -> str:
    """Our numbers beside the paper's, one row per comparison of ``section`` in ``verdicts.csv``."""
    with (RESULTS / "verdicts.csv").open(encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["section"] == section]
    if not rows:
        raise RuntimeError(f"results/verdicts.csv has no rows for section {section!r}")
    notes = list(dict.fromkeys(r["note"] for r in rows if r["note"]))
    lines = ["| quantity | method | ours | paper | ours / paper | verdict |", "|---|---|---|---|---|---|"]
    for r in rows:
        method = (
            r["method"]
            if r["paper_method"] in ("", r["method"])
            else f"{r['method']} (paper: {r['paper_method']})"
        )
        mark = f" [{notes.index(r['note']) + 1}]" if r["note"] else ""
        ratio = f"{float(r['ratio']):.2f}" if r["ratio"] not in ("", "nan") else ""
        lines.append(
            f"| {r['quantity']} | {method} | {_number(r['ours'], r['ours_std'])} | "
            f"{_number(r['paper_value'], r['paper_std'])} | {ratio} | "
            f"{VERDICT_STYLE.get(r['verdict'], r['verdict'])}{mark} |"
        )
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    tally = ", ".join(f"{v} {n}" for v, n in counts.items())
    text = "\n".join(lines) + "\n\n"
    text += "".join(f"[{k}] {note}.  \n" for k, note in enumerate(notes, 1))
    return text + f"*{len(rows)} comparisons: {tally}.* (generated from `results/verdicts.csv`)\n"


def results_file(name: str) -> str:
    """A committed results markdown file, collapsed; its headings become bold lines (not in the TOC)."""
    text = (RESULTS / name).read_text(encoding="utf-8")
    title, _, body = text.partition("\n")
    body = re.sub(r"^#+ (.+)$", r"**\1**", body, flags=re.M)
    indented = "\n".join(("    " + line) if line.strip() else "" for line in body.strip().splitlines())
    return f'??? abstract "`results/{name}`: {title.lstrip("# ").strip()}"\n\n{indented}\n'


MARKER = re.compile(r"<!-- (verdicts|results-file): ([\w.\-]+) -->")


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        kind, arg = match.groups()
        return verdict_table(arg) if kind == "verdicts" else results_file(arg)

    return MARKER.sub(replace, markdown)


# --------------------------------------------------------------------------------------------------
# The version and the changelog

CHANGELOG_PAGE = "changelog.md"


def version() -> str:
    """The version in ``pyproject.toml``: what ``fedgp.__version__`` reports once installed, and
    known to a checkout that never was (``fedgp.version`` says ``0+unknown`` there)."""
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)["project"]["version"]


def _lists(nav, path: str) -> bool:
    if isinstance(nav, str):
        return nav == path
    if isinstance(nav, dict):
        return any(_lists(value, path) for value in nav.values())
    return any(_lists(item, path) for item in nav or [])


def on_config(config):
    release = version()
    config["site_name"] = f"{config['site_name']} {release}"
    config["copyright"] = f"fedgp {release}, the fedgp-gpytorch distribution. MIT License."
    if config["nav"] is not None and not _lists(config["nav"], CHANGELOG_PAGE):
        config["nav"].append({"Changelog": CHANGELOG_PAGE})
    return config


# --------------------------------------------------------------------------------------------------
# Nothing from elsewhere

#: nbconvert's notebook template imports mermaid.js from a CDN where a notebook has a mermaid diagram
#: (none of ours has): the site loads nothing from outside itself, so the loader goes.
NOTEBOOK_MERMAID = re.compile(r'<script type="module">(?:(?!</script>).)*?jp-Mermaid.*?</script>', re.S)


def on_page_content(html: str, page, config, files) -> str:
    if page.file.src_uri.endswith(".ipynb"):
        html = NOTEBOOK_MERMAID.sub("", html)
    return html


# --------------------------------------------------------------------------------------------------
# Files


@event_priority(100)  # before mkdocs-jupyter's on_files, which turns .ipynb files into pages
def on_files(files: Files, config) -> Files:
    _check_coverage()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        files.append(
            File(
                f"notebooks/{notebook.name}",
                src_dir=str(ROOT),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    pages = {
        "api/index.md": api_index(),
        "api/fedgp.md": top_level_page(),
        "api/plumbing.md": plumbing_page(),
        CHANGELOG_PAGE: (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"),
    }
    pages.update({f"api/{name}.md": api_page(name) for name in PAGES})
    for path, content in pages.items():
        files.append(File.generated(config, path, content=content))
    return files
