"""The tests run in a checkout named as the README clones it (``ComfyUI-Steadfast``: no Python identifier).

Without the root ``conftest.py`` pytest imports the root ``__init__.py`` as a top-level module ``__init__`` there,
its relative imports fail and every test errors (seen: 27 errors in tests/core/test_hashing.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tests_run_in_a_checkout_named_comfyui_steadfast(tmp_path: Path) -> None:
    checkout = tmp_path / "ComfyUI-Steadfast"
    shutil.copytree(
        ROOT,
        checkout,
        ignore=shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", "test-artifacts", "*.safetensors"),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/core/test_hashing.py", "-q", "-p", "no:cacheprovider"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    tail = proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "error" not in proc.stdout.splitlines()[-1], tail
