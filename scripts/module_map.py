"""Regenerate the module map in docs/architecture.md from the modules' docstrings.

Each row is ``| `path` | first paragraph of the module docstring, on one line |`` for every tracked ``.py`` file
of the shipped tree (the root ``__init__.py``, ``core/``, ``headless/``, ``nodes/``), in that order.
``tests/repo/test_docs_map.py`` checks the table against the same function, so after adding, removing or
redocumenting a module run::

    python scripts/module_map.py          # rewrites the table in docs/architecture.md
    python scripts/module_map.py --check  # exit 1 (and print the rows) when the table is stale
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
HEADER = "| module | job |\n|---|---|\n"
_ORDER = {"core": 1, "headless": 2, "nodes": 3}


def modules() -> list[str]:
    """Tracked (and new, not ignored) ``.py`` files of the shipped tree, root ``__init__.py`` first."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "__init__.py", "core", "headless", "nodes"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    files = {f for f in out if f.endswith(".py") and (ROOT / f).is_file()}
    return sorted(files, key=lambda f: (_ORDER.get(f.split("/")[0], 0) if "/" in f else 0, f))


def job(path: str) -> str:
    """The first paragraph of the module docstring of ``path``, whitespace collapsed (``""`` without one)."""
    doc = ast.get_docstring(ast.parse((ROOT / path).read_text(encoding="utf-8"))) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def table() -> str:
    """The module map: header plus one row per module."""
    return HEADER + "\n".join(f"| `{m}` | {job(m)} |" for m in modules())


def current_table(text: str) -> tuple[int, int]:
    """``(start, end)`` of the module map in the text of docs/architecture.md."""
    start = text.index(HEADER)
    return start, text.index("\n\n", start)


def main(argv: list[str]) -> int:
    text = DOC.read_text(encoding="utf-8")
    start, end = current_table(text)
    new = table()
    if "--check" in argv:
        if text[start:end] != new:
            print(new)
            return 1
        return 0
    DOC.write_text(text[:start] + new + text[end:], encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
