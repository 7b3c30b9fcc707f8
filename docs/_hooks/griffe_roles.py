"""Griffe extension: GraphVeil's reST docstring markup, read as Markdown by mkdocstrings.

The code's docstrings are Sphinx style (``:param x:``, ``:returns:``, which griffe's ``sphinx``
parser reads) with reST inline roles and doctest blocks, which Markdown does not know:

* ``:class:`~graphveil.units.PrivacyUnit``` (and ``:func:``, ``:meth:``, ``:mod:``, ``:attr:``,
  ``:data:``, ``:exc:``, ``:obj:``) becomes an *optional* cross-reference: a link when the
  target is rendered somewhere in the handbook, plain code otherwise (never a broken link, so
  ``mkdocs build --strict`` does not fail on a reference to torch or a private helper). A name
  without dots is looked up in the docstring's own module first.
* a ``>>>`` doctest block becomes a fenced ``pycon`` block;
* a paragraph ending in ``::`` (reST: a literal block follows) ends in ``:``; the indented
  block after it is already a Markdown code block.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|exc|obj|const):`([^`]+)`")


def _target(owner: griffe.Object, text: str) -> tuple[str, str]:
    """(identifier, shown text) of a role's content: ``~a.b.C`` shows ``C``, ``title <a.b>`` shows title."""
    if m := re.fullmatch(r"(.+?)\s*<([^>]+)>", text):
        title, ident = m.group(1), m.group(2)
    else:
        ident = text
        title = text.lstrip("~.").rsplit(".", 1)[-1] if text.startswith("~") else text.lstrip(".")
    ident = ident.lstrip("~.").removesuffix("()")
    if "." not in ident:
        module = owner.module if isinstance(owner, griffe.Object) else None
        if module is not None:
            ident = f"{module.path}.{ident}"
    return ident, title


def convert(owner: griffe.Object, text: str) -> str:
    """``text`` (one docstring) with roles, doctests and ``::`` rewritten for Markdown."""

    def role(m: re.Match[str]) -> str:
        ident, title = _target(owner, m.group(2))
        return f'<autoref identifier="{html.escape(ident)}" optional><code>{html.escape(title)}</code></autoref>'

    text = _ROLE.sub(role, text)
    return _literal_blocks(_doctests(text))


def _doctests(text: str) -> str:
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>> "):
            indent = line[: len(line) - len(line.lstrip())]
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].strip())
                i += 1
            if out and out[-1].strip():
                out.append("")
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _literal_blocks(text: str) -> str:
    return re.sub(r"(\S)::\n(\s*\n)", r"\1:\n\2", text)


class RestRoles(griffe.Extension):
    """Rewrite every docstring once it is loaded (before it is parsed into sections)."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj, obj.docstring.value)
