"""The newcomer's maps match the code: docs/architecture.md names every Python module of the shipped tree (and
no module that does not exist), and the README's folder table names every top-level folder that is tracked."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("core", "nodes", "headless")


def tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *paths], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_architecture_names_every_module_and_only_real_ones() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = {f for f in tracked(*SHIPPED) if f.endswith(".py")}
    assert modules, "git ls-files found no modules"
    missing = sorted(m for m in modules if f"`{m}`" not in doc)
    assert not missing, f"modules not described in docs/architecture.md: {missing}"
    named = set(re.findall(r"`((?:core|nodes|headless)/[\w/]+\.py)`", doc))
    ghosts = sorted(n for n in named if not (ROOT / n).is_file())
    assert not ghosts, f"docs/architecture.md names modules that do not exist: {ghosts}"


def test_module_map_rows_are_the_module_docstrings() -> None:
    """Each row's job is the first paragraph of its module's docstring (``scripts/module_map.py`` rewrites it)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import module_map
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start, end = module_map.current_table(doc)
    rows = doc[start:end].splitlines()[2:]
    expected = module_map.table().splitlines()[2:]
    assert len(rows) > 40 and "core/torch_compat/__init__.py" in module_map.table()
    stale = sorted(set(rows) ^ set(expected))
    assert rows == expected, f"run `python scripts/module_map.py`; rows that differ: {stale}"


def test_readme_folder_table_names_every_top_level_folder() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    folders = {f.split("/")[0] for f in tracked() if "/" in f}
    assert {"core", "nodes", "tests"} <= folders
    rows = set(re.findall(r"^\| `([\w.-]+)/` \|", readme, flags=re.M))
    assert rows == folders, f"README folder table: missing {sorted(folders - rows)}, extra {sorted(rows - folders)}"


def test_rooms_table_names_every_package_and_only_real_ones() -> None:
    """The "Rooms" table of docs/architecture.md: each package it names exists (with an ``__init__.py``), and every
    package of the shipped tree (a folder of ``core``/``nodes``/``headless`` holding an ``__init__.py``) is named."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("## Rooms", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `((?:core|nodes|headless)(?:/\w+)*)/`", section, flags=re.M))
    assert named, "no rooms table in docs/architecture.md"
    ghosts = sorted(n for n in named if not (ROOT / n / "__init__.py").is_file())
    assert not ghosts, f"rooms named in docs/architecture.md that are not packages: {ghosts}"
    packages = {str(Path(f).parent) for f in tracked(*SHIPPED) if f.endswith("/__init__.py")}
    missing = sorted(packages - named)
    assert not missing, f"packages missing from the rooms table of docs/architecture.md: {missing}"
