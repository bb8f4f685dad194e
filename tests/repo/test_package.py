"""The pack imports outside ComfyUI (library/CLI use), and core/ never imports ComfyUI."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMFY_MODULES = {
    "comfy",
    "comfy_api",
    "comfy_extras",
    "comfy_execution",
    "folder_paths",
    "nodes",
    "server",
    "execution",
    "latent_preview",
    "node_helpers",
}


# a fresh interpreter imports the checkout as package ``steadfast`` (scripts/_steadfast_import.py)
IMPORT_PACK = (
    f"import os, sys\nsys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
    "from _steadfast_import import import_steadfast\nm = import_steadfast()\n"
)


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_core_imports_nothing_from_comfyui():
    files = sorted((ROOT / "core").rglob("*.py"))
    assert len(files) >= 10
    offenders = {str(f.relative_to(ROOT)): sorted(_imported_top_levels(f) & COMFY_MODULES) for f in files}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_pack_imports_without_comfyui_and_sets_cublas_config():
    code = IMPORT_PACK + (
        "import steadfast.core.record.hashing, steadfast.core.compile.registry, steadfast.core.determinism.apply\n"
        "assert not hasattr(m, 'comfy_entrypoint'), 'node adapters loaded without ComfyUI'\n"
        "assert m.WEB_DIRECTORY == './js'\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('comfy', 'comfy_api', 'folder_paths'))\n"
        "assert not bad, bad\n"
        "print(os.environ.get('CUBLAS_WORKSPACE_CONFIG'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CUBLAS_WORKSPACE_CONFIG", "PYTHONPATH")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == ":4096:8"


def test_existing_cublas_config_is_kept():
    code = IMPORT_PACK + ("print(os.environ['CUBLAS_WORKSPACE_CONFIG'])\n")
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == ":16:8"


def test_nodes_import_the_pinned_comfy_api_version_only():
    """docs/compatibility.md: the nodes import ``comfy_api.v0_0_2`` (shipped by 0.8.0 and 0.33.0), never ``latest``."""
    root = Path(__file__).resolve().parents[2]
    users = {
        str(p.relative_to(root)): p.read_text() for p in (root / "nodes").rglob("*.py") if "comfy_api" in p.read_text()
    }  # nodes/host/ too
    assert users, "no node module imports comfy_api"
    for name, text in users.items():
        assert "comfy_api.latest" not in text, name
        assert "comfy_api.v0_0_2" in text, name


def test_the_version_has_one_source_in_code() -> None:
    """``core/version.py`` holds the version; the pack's root re-exports it; ``pyproject.toml`` repeats it for the
    Comfy Registry (which reads the field statically) and must agree."""
    import re

    import tomllib

    root = Path(__file__).resolve().parents[2]
    code = re.search(r'^__version__ = "([^"]+)"$', (root / "core" / "version.py").read_text(), re.MULTILINE)
    assert code, "core/version.py must assign __version__ a string literal"
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    assert project == code.group(1), f"pyproject.toml version {project} != core/version.py {code.group(1)}"
    others = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "version.py"
        and "tests" not in p.parts
        and not any(x.startswith(".") for x in p.parts)
        and re.search(r"^\s*__version__\s*=", p.read_text(encoding="utf-8"), re.MULTILINE)
        and "gpu_protocol_stubs" not in p.parts
    ]
    assert others == [], f"__version__ assigned outside core/version.py: {others}"
