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


def _room_of(path: str, rooms: set[str]) -> str:
    """The room (package folder, or ``core`` for core's top floor) of the module file ``path``."""
    folder = path.rsplit("/", 1)[0]
    while folder not in rooms and "/" in folder:
        folder = folder.rsplit("/", 1)[0]
    return folder


def _imported_rooms(room: str, rooms: set[str]) -> set[str]:
    """The rooms the modules of ``room`` (its own files, not its sub-rooms) import by relative import."""
    import ast

    out = set()
    for f in tracked(room):
        if not f.endswith(".py") or _room_of(f, rooms) != room:
            continue
        for node in ast.walk(ast.parse((ROOT / f).read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = f.split("/")[: -node.level]
            for name in [node.module] if node.module else [a.name for a in node.names]:
                target = "/".join(base + name.split("."))
                target = target + ".py" if (ROOT / (target + ".py")).is_file() else target + "/__init__.py"
                if (ROOT / target).is_file() and (hit := _room_of(target, rooms)) != room:
                    out.add(hit)
    return out


def test_rooms_table_imports_column_matches_the_imports() -> None:
    """Each room's "imports" column names exactly the rooms its modules import: ``core.x`` is core/x, ``nodes/x``
    that room, ``shared leaves`` core's top floor and core/torch_compat, a bare ``core`` any room of core."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("## Rooms", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `((?:core|nodes|headless)(?:/\w+)*)/`[^|]*\|[^|]*\| ([^|]*) \|$", section, flags=re.M)
    rooms = {r for r, _ in rows}
    assert {"core", "nodes", "core/compile", "nodes/host"} <= rooms, rows
    leaves = {"core", "core/torch_compat"}
    wrong = {}
    for room, column in rows:
        named = set()
        for token in re.findall(r"`([\w./]+)`", column):
            named |= {token.replace(".", "/")} if token != "core" else {"core*"}
        if "shared leaves" in column:
            named |= leaves
        actual = _imported_rooms(room, rooms)
        core_rooms = {r for r in actual if r == "core" or r.startswith("core/")}
        allowed = named | (core_rooms if "core*" in named else set())
        unnamed = actual - allowed
        stale = {n for n in named - {"core*"} - leaves if n not in actual}
        if "core*" in named and not core_rooms:
            stale.add("core")
        if unnamed or stale:
            wrong[room] = {"imported, not named": sorted(unnamed), "named, not imported": sorted(stale)}
    assert not wrong, f"docs/architecture.md's rooms table differs from the imports: {wrong}"


def _node_modules() -> dict[str, set[str]]:
    """``{module name: the names of the sibling modules it imports}`` for every module directly in ``nodes/`` that
    defines a ComfyUI node (a class deriving from ``io.ComfyNode``)."""
    import ast

    out = {}
    for f in tracked("nodes"):
        if f.count("/") != 1 or not f.endswith(".py"):
            continue
        tree = ast.parse((ROOT / f).read_text(encoding="utf-8"))
        nodes = [
            c
            for c in tree.body
            if isinstance(c, ast.ClassDef)
            and any(isinstance(b, ast.Attribute) and b.attr == "ComfyNode" for b in c.bases)
        ]
        if not nodes:
            continue
        siblings = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
                siblings |= {n.split(".")[0] for n in names}
        out[Path(f).stem] = siblings | {f"{len(nodes)} nodes"}
    return out


def test_one_node_a_module_and_no_node_imports_another() -> None:
    """Each node module of nodes/ defines one node and imports no other node module (shared widgets are in
    nodes/inputs.py, the DIFFUSERS_PIPELINE type in nodes/pipeline_type.py)."""
    modules = _node_modules()
    assert len(modules) >= 13, modules  # the scan finds the node modules
    crowded = {m: [s for s in got if s.endswith(" nodes")] for m, got in modules.items() if "1 nodes" not in got}
    assert not crowded, f"modules with more than one node: {crowded}"
    crossing = {m: sorted(got & set(modules)) for m, got in modules.items() if got & set(modules)}
    assert not crossing, f"node modules importing another node module: {crossing}"
