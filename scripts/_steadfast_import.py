"""Import this checkout as the package ``steadfast``: the one place that does it.

The repo root is a ComfyUI custom-node folder (``ComfyUI/custom_nodes/ComfyUI-Steadfast``), not an
installed package, so tests, benchmarks and ``scripts/steadfast.py`` load it under a stable name.
ComfyUI itself loads it under its folder name; everything inside uses relative imports, so both work.
``scripts/`` is not a package: callers put it on ``sys.path`` and ``import _steadfast_import``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def import_steadfast(root: Path = ROOT) -> ModuleType:
    """Register ``root`` (default: this checkout) as ``sys.modules["steadfast"]`` and run its ``__init__``.

    A ``steadfast`` already imported is returned as it is. Whether the node adapters load depends on
    whether ComfyUI's ``comfy_api`` is importable at that moment (see the root ``__init__.py``).
    Raises ``FileNotFoundError`` when ``root/__init__.py`` does not exist; whatever ``__init__`` raises.
    """
    if "steadfast" in sys.modules:
        return sys.modules["steadfast"]
    init = Path(root) / "__init__.py"
    if not init.is_file():
        raise FileNotFoundError(f"no package at {root} ({init.name} missing)")
    spec = importlib.util.spec_from_file_location("steadfast", init, submodule_search_locations=[str(root)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["steadfast"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["steadfast"]
        raise
    return module
