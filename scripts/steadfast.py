"""Run the ``steadfast`` command from a checkout: ``python scripts/steadfast.py verify --tiny sd`` or ``... run WORKFLOW``.

Registers the repository root as the package ``steadfast`` (as ``tests/conftest.py`` does) and calls
``steadfast.headless.cli.main`` (``run`` and ``verify``); installed packs get the ``steadfast`` console script instead.
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
        "steadfast", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["steadfast"] = module
    spec.loader.exec_module(module)


if __name__ == "__main__":
    _register_package()
    from steadfast.headless.cli import main

    sys.exit(main())
