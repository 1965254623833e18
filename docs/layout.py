"""The layout block of ``docs/backends.md``, generated from the code: every module of
``src/commitstore``, folder by folder, with the first line of its docstring.

``python docs/layout.py`` rewrites the block between ``<!-- layout -->`` and ``<!-- /layout -->``;
``docs/check_docs.py`` (lint) fails when the block differs from the code, so a module that is
added, moved or renamed shows up on the page in the same change.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "src" / "commitstore"
PAGE = ROOT / "docs" / "backends.md"
BLOCK = re.compile(r"(<!-- layout -->\n)(?P<body>.*?)(<!-- /layout -->)", re.S)
WIDTH = 100
NAME_COL = 28


ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def first_line(path: Path) -> str:
    """The first sentence of the module's docstring, markup removed ("(no docstring)" when it
    has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path)))
    if not doc:
        return "(no docstring)"
    para = " ".join(doc.strip().split("\n\n")[0].split())
    para = ROLE.sub(r"\1", para).replace("``", "")
    end = re.search(r"\.(\s|$)", para)
    return para[: end.start() + 1] if end else para


def _entry(indent: int, name: str, text: str) -> list[str]:
    head = " " * indent + name
    pad = max(NAME_COL, len(head) + 2)
    if not text:
        return [head]
    wrapped = textwrap.wrap(text, WIDTH - pad) or [""]
    lines = [head.ljust(pad) + wrapped[0]]
    lines += [" " * pad + more for more in wrapped[1:]]
    return lines


def _folder(path: Path, indent: int) -> list[str]:
    lines: list[str] = []
    files = sorted(p for p in path.glob("*.py"))
    for f in files:
        lines += _entry(indent, f.name, first_line(f))
    for sub in sorted(p for p in path.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        lines.append(" " * indent + sub.name + "/")
        lines += _folder(sub, indent + 2)
    return lines


def render() -> str:
    """The block's body: a fenced tree of every module."""
    return "```\ncommitstore/\n" + "\n".join(_folder(PKG, 2)) + "\n```\n"


def stale(text: str) -> bool:
    """True when ``text`` has no layout block or one that differs from the code."""
    m = BLOCK.search(text)
    return m is None or m.group("body") != render()


def main() -> int:
    text = PAGE.read_text()
    if BLOCK.search(text) is None:
        print("docs/backends.md has no <!-- layout --> block", file=sys.stderr)
        return 1
    PAGE.write_text(BLOCK.sub(lambda m: m.group(1) + render() + m.group(3), text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
