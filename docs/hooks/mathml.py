"""MkDocs hook: the site's math as MathML, converted from TeX when the site is built.

Why: the site must read offline (a wheel's docs, a laptop on a train, a screenshot taken without a
network). MathJax from a CDN shows raw TeX then, and vendoring MathJax or KaTeX means megabytes of
JavaScript and fonts in the repository, or copied into every build. Instead, ``latex2mathml`` (pure
Python, in the ``docs`` extra) turns each formula into MathML when the site is built, and browsers
lay MathML Core out natively (Chromium and Edge since 109, Firefox, Safari): no script, no font to
download, nothing to load at all.

What is converted:

* **Pages** (and docstrings): ``pymdownx.arithmatex`` in generic mode wraps each formula in
  ``<span class="arithmatex">\\(...\\)</span>`` or ``<div class="arithmatex">\\[...\\]</div>``.
* **Notebooks**: mkdocs-jupyter's (nbconvert's) markdown keeps math as ``$...$``, ``$$...$$`` or
  ``\\begin{env}...\\end{env}`` in the text; they are converted wherever MathJax would have looked
  (not in ``pre``, ``code``, ``script``, ``style`` or ``textarea``). The MathJax 2 loader that the
  notebook template adds (with an empty ``src``) is dropped.

A formula that ``latex2mathml`` cannot convert faithfully fails the build, naming the page and the
formula: an unknown command (kept as ``\\foo`` text by the converter), an alignment ``&`` outside an
environment it knows, or an element outside MathML Core (``menclose`` for ``\\boxed``, ...), which
browsers would not draw. ``\\sin``, ``\\cos``, ... get TeX's thin space before an argument that is
not in parentheses (``\\cos 15x``), which MathML Core does not add by itself.
"""

from __future__ import annotations

import html
import re
from xml.etree.ElementTree import Element, tostring

from latex2mathml import commands as _commands
from latex2mathml.converter import convert_to_element
from mkdocs.exceptions import PluginError

#: What browsers lay out (https://w3c.github.io/mathml-core/#mathml-elements-and-attributes).
MATHML_CORE = {
    "math", "annotation", "annotation-xml", "maction", "merror", "mfrac", "mi", "mmultiscripts",
    "mn", "mo", "mover", "mpadded", "mphantom", "mprescripts", "mroot", "mrow", "ms", "mspace",
    "msqrt", "mstyle", "msub", "msubsup", "msup", "mtable", "mtd", "mtext", "mtr", "munder",
    "munderover", "none", "semantics",
}  # fmt: skip
FUNCTIONS = {name.lstrip("\\") for name in _commands.FUNCTIONS}
#: Elements whose children are a row (the others' children are positions: base, script, ...).
ROWS = {"math", "mrow", "mstyle", "mtd", "msqrt", "mpadded", "mphantom", "merror"}
#: How many children the positional elements take (a "\\frac{a" converts to an mfrac with one).
ARITY = {"mfrac": 2, "msup": 2, "msub": 2, "msubsup": 3, "mover": 2, "munder": 2, "munderover": 3, "mroot": 2}
OPENING = {"(", "[", "{", "|", "\u2016", "\u27e8", "&#x00028;", "&#x0005B;", "&#x0007B;", "&#x0007C;"}


class MathError(ValueError):
    """A formula latex2mathml cannot convert into MathML Core faithfully."""


def _function_spacing(element: Element) -> None:
    """TeX's thin space after ``\\cos`` (or ``\\sin^2``) before an argument not in parentheses."""
    children = list(element) if element.tag in ROWS else []
    for i in reversed(range(len(children) - 1)):
        child, after = children[i], children[i + 1]
        base = child[0] if child.tag in ("msup", "msub", "msubsup") and len(child) else child
        if base.tag == "mi" and base.text in FUNCTIONS:
            if not (after.tag == "mo" and (after.text or "") in OPENING):
                element.insert(i + 1, Element("mspace", width="0.1667em"))
    for child in element:
        _function_spacing(child)


def _check(element: Element, tex: str) -> None:
    for node in element.iter():
        if node.tag not in MATHML_CORE:
            raise MathError(f"<{node.tag}> is not MathML Core (browsers do not draw it): {tex!r}")
        if node.tag in ARITY and len(node) != ARITY[node.tag]:
            parts = f"{len(node)} parts, not {ARITY[node.tag]}"
            raise MathError(f"<{node.tag}> with {parts} (a brace missing?): {tex!r}")
        text = node.text or ""
        if node.tag in ("mi", "mo") and text.startswith("\\") and len(text) > 1:
            raise MathError(f"unknown TeX command {text}: {tex!r}")
        if node.tag in ("mi", "mo") and text == "&":
            raise MathError(f"an alignment '&' outside an environment latex2mathml knows: {tex!r}")


def tex_to_mathml(tex: str, display: bool = False) -> str:
    """``<math>`` for a TeX formula (without its delimiters); :class:`MathError` where it cannot."""
    try:
        element = convert_to_element(tex.strip(), display="block" if display else "inline")
    except Exception as error:  # noqa: BLE001 - latex2mathml raises many kinds on malformed TeX
        raise MathError(f"latex2mathml cannot convert {tex!r}: {error!r}") from error
    _check(element, tex)
    _function_spacing(element)
    # latex2mathml stores symbols as character references ("&#x003B8;") in the text; keep them as such,
    # and everything else escaped (a "<" in \text{a<b} must stay "&lt;" in the page).
    return re.sub(r"&amp;(#x[0-9A-Fa-f]+;)", r"&\1", tostring(element, encoding="unicode"))


# --------------------------------------------------------------------------------------------------
# Pages: pymdownx.arithmatex's spans and divs

ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
DELIMITED = re.compile(r"^\\\((.*)\\\)$|^\\\[(.*)\\\]$", re.S)


def _arithmatex(match: re.Match) -> str:
    tag, body = match.groups()
    tex = html.unescape(body.strip())
    delimited = DELIMITED.match(tex)
    if delimited:
        tex = delimited.group(1) if delimited.group(1) is not None else delimited.group(2)
    return f'<{tag} class="arithmatex">{tex_to_mathml(tex, display=tag == "div")}</{tag}>'


# --------------------------------------------------------------------------------------------------
# Notebooks: math in the text, as nbconvert leaves it

NOTEBOOK_MATH = re.compile(
    r"(?<!\\)\$\$(?P<block>.+?)(?<!\\)\$\$"
    r"|(?P<env>\\begin\{(?P<name>[a-z]*\*?)\}.*?\\end\{(?P=name)\})"
    r"|(?<![$\\])\$(?P<inline>[^$]+?)(?<![$\\])\$",
    re.S,
)
TAG = re.compile(r"<!--.*?-->|<(/?)([a-zA-Z][\w:-]*)(?:\s[^>]*)?>", re.S)
#: Where MathJax did not look for math; script, style and textarea hold raw text (no tags inside).
SKIPPED = {"pre", "code", "script", "style", "textarea", "math", "svg"}
RAW_TEXT = {"script", "style", "textarea"}
NOTEBOOK_MATHJAX = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)


def _notebook_formula(match: re.Match) -> str:
    if match.group("block") is not None:
        return tex_to_mathml(html.unescape(match.group("block")), display=True)
    if match.group("env") is not None:
        return tex_to_mathml(html.unescape(match.group("env")), display=True)
    return tex_to_mathml(html.unescape(match.group("inline")))


def render_text_math(page_html: str) -> str:
    """``$...$``, ``$$...$$`` and ``\\begin{env}...\\end{env}`` in the text of ``page_html`` (not
    in the elements of ``SKIPPED``) as MathML."""
    out, position, skipping = [], 0, []
    while position < len(page_html):
        if skipping and skipping[-1] in RAW_TEXT:  # jump to its end tag: "<" inside is not a tag
            end = page_html.lower().find(f"</{skipping.pop()}", position)
            end = len(page_html) if end < 0 else end
            out.append(page_html[position:end])
            position = end
            continue
        tag = TAG.search(page_html, position)
        end = tag.start() if tag else len(page_html)
        text = page_html[position:end]
        out.append(text if skipping else NOTEBOOK_MATH.sub(_notebook_formula, text))
        if tag is None:
            break
        out.append(tag.group(0))
        position = tag.end()
        closing, name = tag.group(1), (tag.group(2) or "").lower()
        if name in SKIPPED and not tag.group(0).endswith("/>"):
            if not closing:
                skipping.append(name)
            elif name in skipping:
                del skipping[len(skipping) - 1 - skipping[::-1].index(name) :]
    return "".join(out)


def render_math(page_html: str, notebook: bool = False) -> str:
    """Every formula of a page's HTML as MathML (see the module)."""
    page_html = ARITHMATEX.sub(_arithmatex, page_html)
    if notebook:
        page_html = render_text_math(NOTEBOOK_MATHJAX.sub("", page_html))
    return page_html


def on_page_content(html_content: str, page, config, files) -> str:
    try:
        return render_math(html_content, notebook=page.file.src_uri.endswith(".ipynb"))
    except MathError as error:  # the build stops, naming the page and the formula
        raise PluginError(f"docs/hooks/mathml.py: {page.file.src_uri}: {error}") from None
