"""Test set-up: make the repo root importable as the package ``steadfast`` (``scripts/_steadfast_import.py``)."""
from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from _steadfast_import import import_steadfast  # noqa: E402

import_steadfast()
