"""The documentation site builds with warnings as errors, its links resolve, and its examples run.

* ``mkdocs build --strict`` into a temporary folder: MkDocs >= 1.6 validates every link and anchor
  between pages (``validation:`` in ``mkdocs.yml``), mkdocstrings every ``:::`` block, the hook
  that every public module has an API page.
* Every relative ``href``/``src`` in the built HTML resolves to a file of the site, and every
  ``#anchor`` into a page exists there.
* The ``python`` code blocks of the pages run as written, page by page in one namespace (like a
  notebook). A block right after a ``<!-- docs-test: skip (reason) -->`` comment is not run (it
  needs a cluster, a deployment or minutes); every skip gives its reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

if os.environ.get("CI") == "true":  # make test installs the docs extra: in CI its absence is a failure
    import mkdocs  # noqa: F401
    import sklearn  # noqa: F401
else:
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]'); make test installs it")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr[-6000:]}"
    return out


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append(attrs[key])


def _parse(page: Path) -> _Links:
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def test_site_builds_strict_with_every_page(site):
    for page in [
        "index.html",
        "getting-started/index.html",
        "own-data/index.html",
        "concepts/index.html",
        "reproducing/index.html",
        "api/index.html",
        "api/data/index.html",
        "api/fedgp/index.html",
        "api/run/index.html",
        "api/errors/index.html",
        "api/testing/index.html",
        "notebooks/quickstart/index.html",
    ]:
        assert (site / page).is_file(), page
    index = (site / "api/index.html").read_text(encoding="utf-8")
    for module in ("run", "errors", "testing"):  # the run layer, the errors, the shipped contracts
        assert f'href="{module}/"' in index, module
    top = (site / "api/fedgp/index.html").read_text(encoding="utf-8")
    assert "fedgp.run.fit" in top and 'href="../errors/"' in top  # where fit and the errors live
    api = (site / "api/strategies/index.html").read_text(encoding="utf-8")
    assert 'id="fedgp.strategies.FGPR"' in api  # mkdocstrings rendered the class under its public path
    assert "local_steps" in api  # with its signature


def test_every_relative_link_resolves(site):
    # 404.html is served at any missing path, so MkDocs gives it absolute links ("/assets/...")
    pages = {p: _parse(p) for p in site.rglob("*.html") if p.name != "404.html"}
    broken = []
    for page, parsed in pages.items():
        for link in parsed.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "data:", "javascript:")):
                continue
            target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: {link}")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{page.relative_to(site)}: {link} (no such anchor)")
    assert not broken, "broken links in the built site:\n" + "\n".join(broken[:50])


def test_api_reference_shows_every_public_name(site):
    """Each name of each public module's ``__all__`` has an entry (an element with its dotted id) on
    the API pages, under the module or under a package above it that re-exports it."""
    import importlib

    from tests.test_public_api import public_modules

    ids = set()
    for page in (site / "api").rglob("*.html"):
        ids |= _parse(page).ids
    missing = []
    for module_name in public_modules():
        if module_name == "fedgp":  # the top level: its names are documented where they live
            continue
        parts = module_name.split(".")
        owners = [".".join(parts[:k]) for k in range(len(parts), 1, -1)]
        for name in importlib.import_module(module_name).__all__:
            if not any(f"{owner}.{name}" in ids for owner in owners):
                missing.append(f"{module_name}.{name}")
    assert not missing, "public names without an API entry:\n" + "\n".join(missing)


def test_reproducing_tables_come_from_the_committed_csv(site):
    import pandas as pd

    html = (site / "reproducing/index.html").read_text(encoding="utf-8")
    verdicts = pd.read_csv(ROOT / "results" / "verdicts.csv")
    assert "<!-- verdicts:" not in html
    for section in ("table1", "table2", "table3", "werner"):
        assert len(verdicts[verdicts["section"] == section]) > 0
    # every comparison is on the page, with its verdict
    assert html.count("<tr>") >= len(verdicts)
    for quantity in verdicts["quantity"].unique():
        assert quantity.split(",")[0] in html


# -- the examples ---------------------------------------------------------------------------------

SKIP = re.compile(r"<!-- docs-test: skip \((?P<reason>[^)]+)\) -->\s*$")
FENCE = re.compile(r"^```python\n(.*?)^```\n(?:\s*^```text\n(?P<output>.*?)^```)?", re.S | re.M)


def code_blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """``(line, code, skip reason or None)`` for each python block of a page."""
    return [(line, code, skip) for line, code, skip, _ in _blocks(page)]


def _blocks(page: Path) -> list[tuple[int, str, str | None, str | None]]:
    """As :func:`code_blocks`, with the ``text`` block that shows the output, if one follows."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip().splitlines()
        skip = SKIP.search(before[-1]) if before else None
        line = text[: match.start()].count("\n") + 2
        blocks.append((line, match.group(1), skip.group("reason") if skip else None, match.group("output")))
    return blocks


#: Pages with at least one example that runs (a page may show only skipped ones, e.g. the README's).
PAGES = sorted(
    p.relative_to(DOCS).as_posix()
    for p in DOCS.rglob("*.md")
    if any(skip is None for _, _, skip in code_blocks(p))
)


def test_getting_started_shows_the_readme_example():
    """The docs' ten lines are the README's, which tests/test_readme.py runs as written."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ten_lines = FENCE.search(readme).group(1)
    blocks = [code for _, code, _ in code_blocks(DOCS / "getting-started.md")]
    assert ten_lines in blocks


def test_pages_with_examples_are_found():
    assert {"index.md", "own-data.md", "concepts.md", "guides/fgpr.md", "guides/clustered.md"} <= set(PAGES)
    skipped = [(p, line) for p in DOCS.rglob("*.md") for line, _, skip in code_blocks(p) if skip is not None]
    assert 0 < len(skipped) <= 8, skipped  # a handful that need a cluster or minutes, each with its reason


@pytest.mark.parametrize("name", PAGES)
def test_page_examples_run_as_written(name, tmp_path, monkeypatch, capsys):
    """Each page's examples run in order in one namespace; where a ``text`` block after an example
    shows what it prints, every line of it is printed."""
    pytest.importorskip("sklearn")  # "Your own data" loads scikit-learn's diabetes data
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    namespace: dict = {"__name__": "__docs__"}
    for line, code, skip, output in _blocks(DOCS / name):
        if skip is not None:
            continue
        capsys.readouterr()
        exec(compile(code, f"docs/{name}:{line}", "exec"), namespace)
        printed = {row.strip() for row in capsys.readouterr().out.splitlines()}
        if output is not None:
            shown = [row.strip() for row in output.splitlines() if row.strip()]
            assert set(shown) <= printed, f"docs/{name}:{line} prints\n" + "\n".join(sorted(printed))
