"""Test set-up: make the repo root importable as the package ``steadfast`` (``scripts/_steadfast_import.py``) and
the shared test fixtures (``tests/fixtures/``: tiny modules, tiny pipelines) importable by module name.

Tests by kind: ``tests/core`` (the engine, plain torch), ``tests/comfy`` (needs a real ComfyUI), ``tests/headless``
(the application: ``steadfast`` CLI, runner, verify), ``tests/repo`` (the repository itself: sources, docs,
packaging). Nothing under ``tests/`` is shipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
for _path in (SCRIPTS, FIXTURES):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from _steadfast_import import import_steadfast  # noqa: E402

import_steadfast()

from torch_fixtures import fresh_dynamo, one_thread, reg  # noqa: E402,F401  (fixtures for every test kind)
