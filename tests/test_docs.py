"""The documentation site builds with warnings as errors, its links resolve, and its examples run.

* ``mkdocs build --strict`` into a temporary folder: MkDocs >= 1.6 validates every link and anchor
  between pages (``validation:`` in ``mkdocs.yml``), mkdocstrings every ``:::`` block, the hook
  that every public module has an API page.
* Every relative ``href``/``src`` in the built HTML resolves to a file of the site, and every
  ``#anchor`` into a page exists there.
* The ``python`` code blocks of the pages run as written, page by page in one namespace (like a
  notebook). A block right after a ``<!-- docs-test: skip (reason) -->`` comment is not run (it
  needs a cluster, a deployment or minutes); every skip gives its reason.
* The site reads offline: its math is MathML (no TeX left, no MathJax), it loads no script or
  stylesheet from elsewhere, its text shows no raw Sphinx role, and its code lines fit the page.
* The site names its version and has the changelog.
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


# -- offline, rendered, versioned ----------------------------------------------------------------


class _Text(HTMLParser):
    """A page's text outside ``SKIPPED`` elements (code, scripts, styles and the MathML itself), and
    the addresses of what it loads (scripts, stylesheets)."""

    SKIPPED = {"script", "style", "pre", "code", "textarea", "math", "svg"}

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.loads: list[str] = []
        self._open: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script" and attrs.get("src"):
            self.loads.append(attrs["src"])
        if tag == "link" and "stylesheet" in (attrs.get("rel") or "") and attrs.get("href"):
            self.loads.append(attrs["href"])
        if tag in self.SKIPPED:
            self._open.append(tag)

    def handle_endtag(self, tag):
        if tag in self._open:
            del self._open[len(self._open) - 1 - self._open[::-1].index(tag) :]

    def handle_data(self, data):
        if not self._open:
            self.text.append(data)


def _text(page: Path) -> _Text:
    parser = _Text()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def _html_pages(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def test_site_loads_nothing_from_elsewhere(site):
    """No CDN: every script and stylesheet is a file of the site (math needs none: it is MathML)."""
    outside = []
    for page in _html_pages(site):
        html = page.read_text(encoding="utf-8")
        outside += [f"{page.relative_to(site)}: {url}" for url in _text(page).loads if urlsplit(url).netloc]
        outside += [f"{page.relative_to(site)}: {m}" for m in re.findall(r"unpkg\.com|cdnjs|jsdelivr", html)]
        scripts = " ".join(re.findall(r"<script\b[^>]*>.*?</script>", html, re.S | re.I)).lower()
        assert "mathjax" not in scripts, f"{page.relative_to(site)} still loads or configures MathJax"
    assert not outside, "the site loads from elsewhere:\n" + "\n".join(sorted(set(outside))[:30])


#: TeX a reader would see raw: MathJax's delimiters, and in a notebook's text a $...$ pair.
RAW_TEX = re.compile(r"\\\(|\\\[|\$\$|\\begin\{")
RAW_INLINE_TEX = re.compile(r"(?<![\\$])\$[^$\s][^$]*?(?<![\\$\s])\$")


def test_math_is_mathml_with_no_tex_left(site):
    """Every formula of the pages and the notebooks is MathML: no TeX is left in any page's text."""
    raw = []
    for page in _html_pages(site):
        text = "".join(_text(page).text)
        found = RAW_TEX.findall(text)
        if "notebooks" in page.parts:
            found += RAW_INLINE_TEX.findall(text)
        raw += [f"{page.relative_to(site)}: {tex!r}" for tex in found]
    assert not raw, "TeX left unrendered:\n" + "\n".join(raw[:30])
    notebook = (site / "notebooks/table1_multifidelity/index.html").read_text(encoding="utf-8")
    assert notebook.count("<math ") >= 6  # its six formulas: y_h, y_l, the domains of the two examples
    assert "<mfrac>" in notebook and "<mspace" in notebook  # \tfrac12; the thin space of \cos 15x


def _mathml_hook():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fedgp_docs_mathml", DOCS / "hooks" / "mathml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mathml_hook_converts_or_refuses():
    mathml = _mathml_hook()
    cos = mathml.tex_to_mathml(r"y_l = \cos 15x")
    assert cos.startswith("<math") and '<mi>cos</mi><mspace width="0.1667em" /><mn>15</mn>' in cos
    assert "<mspace" not in mathml.tex_to_mathml(r"\sin(12x-4)")  # no space before a parenthesis
    assert "&lt;" in mathml.tex_to_mathml(r"\text{a<b}")  # stays valid HTML
    assert 'display="block"' in mathml.render_math('<div class="arithmatex">\\[x^2\\]</div>')
    page = "<p>$a$ <code>$HOME $PATH</code></p><script>if (a<b) x = '$y$';</script>"
    assert mathml.render_text_math(page).count("<math ") == 1  # code and scripts are left alone
    for bad in (r"\foo x", r"\boxed{x}", r"\frac{a", r"\begin{aligned}a&=b\end{aligned}"):
        with pytest.raises(mathml.MathError):
            mathml.tex_to_mathml(bad)


class _RoleText(_Text):
    """The text with inline code kept (a role's target renders as <code>), less scripts and styles."""

    SKIPPED = {"script", "style", "pre", "textarea", "math", "svg"}


#: A Sphinx role as it reads when nothing rendered it (``:func:`x```, or ``:func:`` before <code>).
RAW_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc|const):(?=[`\w])")


def test_no_raw_sphinx_roles_in_the_pages(site):
    raw = []
    for page in _html_pages(site):
        parser = _RoleText()
        parser.feed(page.read_text(encoding="utf-8"))
        text = "".join(parser.text)
        for m in RAW_ROLE.finditer(text):
            raw.append(f"{page.relative_to(site)}: ...{text[max(0, m.start() - 40) : m.end() + 40]}...")
    assert not raw, "raw Sphinx roles in the site:\n" + "\n".join(raw[:30])
    index = (site / "api/index.html").read_text(encoding="utf-8")
    assert 'href="run/#fedgp.run.fit"' in index  # fedgp.sklearn's summary links fedgp.fit to its entry


def test_site_names_its_version_and_has_the_changelog(site):
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    home = (site / "index.html").read_text(encoding="utf-8")
    assert f"<title>fedgp {version}</title>" in home  # the site's name, in every header
    assert re.search(rf'md-copyright__highlight">\s*fedgp {re.escape(version)}\b', home)  # and footer
    changelog = (site / "changelog/index.html").read_text(encoding="utf-8")
    first = re.search(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M).group(1)
    assert first.split(" ")[0].strip("[]") in changelog  # generated from CHANGELOG.md
    assert 'href="changelog/"' in home  # and in the navigation


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


#: What a code block's column holds without scrolling in a laptop-wide window (1440 px: about 115
#: characters; 1280 px: about 87); docs/stylesheets/extra.css widens the column.
CODE_WIDTH = 100
FENCE_LINE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def fenced_blocks(page: Path) -> list[tuple[int, str, str]]:
    """``(line, language, code)`` for each fenced block of a page, indented ones included."""
    blocks, lines, start = [], page.read_text(encoding="utf-8").splitlines(), None
    for number, line in enumerate(lines, 1):
        fence = FENCE_LINE.match(line)
        if start is None and fence:
            start, closing, language, body = number, fence.group("fence"), fence.group("info").strip(), []
        elif start is not None and fence and fence.group("fence").startswith(closing) and not fence["info"]:
            blocks.append((start, language.split()[0] if language else "", "\n".join(body)))
            start = None
        elif start is not None:
            body.append(line)
    return blocks


def test_code_lines_fit_the_page():
    """No line of a code block is wider than ``CODE_WIDTH`` characters, on every page.

    Except ``text`` blocks: they show a program's output as it prints it (the tests compare them with
    the printed lines), and wrap in the browser instead (docs/stylesheets/extra.css). The README's
    ten lines, copied to "Getting started", are held to the same width."""
    wide = []
    for page in sorted(DOCS.rglob("*.md")):
        for line, language, code in fenced_blocks(page):
            if language == "text":
                continue
            wide += [
                f"docs/{page.relative_to(DOCS)}:{line + k} ({len(row)} characters): {row}"
                for k, row in enumerate(code.splitlines(), 1)
                if len(row) > CODE_WIDTH
            ]
    assert not wide, f"code lines wider than {CODE_WIDTH} characters:\n" + "\n".join(wide)


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


def test_pages_that_say_which_fedgp_ran_them_name_this_version():
    """A page that shows printed output says which fedgp printed it; that is this version, or the
    output must be run again (files-and-sklearn.md said 0.1.0 after 0.2.0's defaults changed it)."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    stale = []
    for page in (ROOT / "docs").rglob("*.md"):
        for said in re.findall(r"run as shown \(fedgp (\d+\.\d+\.\d+)", page.read_text()):
            if said != version:
                stale.append(f"{page.relative_to(ROOT)}: fedgp {said}")
    assert not stale, f"pages whose output another fedgp printed (this is {version}): {stale}"
