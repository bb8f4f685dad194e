"""Test set-up: make the repo root importable as the package ``steadfast``.

The repo root is a ComfyUI custom-node folder (``ComfyUI/custom_nodes/ComfyUI-Steadfast``), not an
installed package, so tests load it under a stable name. ComfyUI itself loads it under its folder
name; everything inside uses relative imports, so both work.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _register_package() -> None:
    if "steadfast" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        "steadfast", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["steadfast"] = module
    spec.loader.exec_module(module)


_register_package()
