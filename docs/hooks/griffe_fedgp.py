"""A griffe extension for fedgp's docstrings, loaded by mkdocstrings (``mkdocs.yml``).

fedgp's docstrings were written to be read in the source and with ``help()``: Sphinx-style roles
(``:class:`~fedgp.strategies.FGPR```), ``#:`` comments above module constants, ``::`` before an
example. mkdocstrings renders Markdown and reads a constant's docstring only from a string literal
after it, so, before rendering:

* a role becomes a cross-reference to the object's API entry where the reference resolves (an
  optional autoref: a name the docs do not show stays plain code, with no warning). ``~`` shows
  the last component only; a relative name (``.base``, ``check``) is resolved against the object's
  module and class;
* the ``#:`` comment lines right above an attribute become its docstring when it has none;
* a paragraph ending in ``::`` ends in ``:`` (the indented block after it is code in Markdown too);
* the first sentence (wrapped over lines in the source) becomes the first line: the API pages'
  summary tables show a docstring's first line only.
"""

from __future__ import annotations

import html
import re

import griffe

ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|obj|exc|const):`(~?)([^`<]+?)`(\\\\ |\\ )?")


def _candidates(target: str, obj: griffe.Object) -> list[str]:
    """The absolute paths a role's target may mean, most specific first."""
    target = target.strip().rstrip("()")
    module = obj.module
    if target.startswith("."):  # relative to the package (``.base``) or its parent (``..x``)
        package = module if module.is_package else module.parent
        dots = len(target) - len(target.lstrip("."))
        for _ in range(dots - 1):
            package = package.parent if package is not None and package.parent is not None else package
        base = package.path if package is not None else module.path
        return [f"{base}.{target.lstrip('.')}"]
    if target.startswith("fedgp."):
        return [target]
    found = []
    cls = obj if obj.is_class else (obj.parent if obj.parent is not None and obj.parent.is_class else None)
    if cls is not None:
        found.append(f"{cls.path}.{target}")
    found.append(f"{module.path}.{target}")
    if module.parent is not None:
        found.append(f"{module.parent.path}.{target}")
    return found


def _reference(match: re.Match, obj: griffe.Object) -> str:
    _, tilde, target = match.group(1), match.group(2), match.group(3).strip()
    label = target.rstrip("()").split(".")[-1] if tilde else target.lstrip(".")
    if match.group(3).endswith("()"):
        label += "()"
    identifier = _candidates(target, obj)[0]
    try:  # resolve a bare or relative name to the first candidate griffe knows
        root = obj.package
        for candidate in _candidates(target, obj):
            if candidate.split(".", 1)[0] != root.name:
                continue
            try:
                root[candidate.split(".", 1)[1]]
            except (KeyError, IndexError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            identifier = candidate
            break
    except Exception:  # noqa: BLE001 - a docstring must never break the build; the link is optional
        pass
    code = f"<code>{html.escape(label)}</code>"
    return f'<autoref identifier="{html.escape(identifier)}" optional>{code}</autoref>'


def _comment_above(attr: griffe.Attribute) -> str | None:
    try:
        lines = attr.module.lines
    except Exception:  # noqa: BLE001 - no source, no comment
        return None
    i, block = (attr.lineno or 0) - 2, []
    while 0 <= i < len(lines) and lines[i].strip().startswith("#:"):
        block.insert(0, lines[i].strip()[2:].strip())
        i -= 1
    return " ".join(block) or None


class FedgpDocstrings(griffe.Extension):
    """Sphinx-flavoured docstrings and ``#:`` comments as Markdown docstrings (see the module)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        for obj in _walk(pkg):
            if obj.is_attribute and obj.docstring is None:
                text = _comment_above(obj)
                if text:
                    obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj)
            if obj.docstring is not None:
                value = ROLE.sub(lambda m, o=obj: _reference(m, o), obj.docstring.value)
                value = re.sub(r"::\n", ":\n", value)
                obj.docstring.value = _one_line_summary(value)


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(*])")
ABBREVIATIONS = ("e.g.", "i.e.", "al.", "cf.", "vs.", "Fig.", "Eq.", "Alg.", "No.")


def _one_line_summary(value: str) -> str:
    """The first paragraph's first sentence on the first line, the rest of the paragraph after it
    (Markdown joins the lines again, so the docstring reads as before)."""
    head, blank, rest = value.partition("\n\n")
    lines = head.splitlines()
    markers = ("- ", "* ", ">>>", "|", "Args:", "Parameters", "Returns", "Example")
    if len(lines) < 2 or any(line.lstrip().startswith(markers) or line.startswith(" ") for line in lines[1:]):
        return value
    paragraph = " ".join(line.strip() for line in lines)
    for match in SENTENCE_END.finditer(paragraph):
        if not paragraph[: match.start()].endswith(ABBREVIATIONS):
            paragraph = paragraph[: match.start()] + "\n" + paragraph[match.end() :]
            break
    return paragraph + blank + rest


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if member.is_alias:
            continue
        yield from _walk(member)
