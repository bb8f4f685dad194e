"""``scripts/setup_env.sh`` on a machine without ComfyUI: one line says what is missing and how to get it.

Before issue 37 it warned that the tests would skip, then read a requirements file that is not there under
``set -euo pipefail`` and exited with status 1 and no word. Run here as a new user would meet it: no checkout at
``COMFYUI_PATH``, no network (a ``git`` that fails as a clone without network does), no snapshot folder.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup_env.sh"


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "git").write_text("#!/bin/sh\necho 'fatal: unable to access github.com' >&2\nexit 128\n")
    (fake / "git").chmod(0o755)
    base = {
        "PATH": f"{fake}:{os.environ['PATH']}",
        "HOME": str(tmp_path / "home"),
        "COMFYUI_PATH": str(tmp_path / "no-comfyui"),
        "STEADFAST_SNAPSHOTS": str(tmp_path / "no-snapshots"),
        "STEADFAST_VENV": str(tmp_path / "venv"),
    }
    return subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**base, **env}
    )


@pytest.mark.parametrize("no_clone", [False, True])
def test_without_comfyui_one_line_says_what_is_missing_and_how_to_get_it(tmp_path: Path, no_clone: bool) -> None:
    proc = _run(tmp_path, **({"STEADFAST_NO_CLONE": "1"} if no_clone else {}))
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert proc.stdout == ""  # nothing for scripts/test.sh to take as export lines or a python path
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert f"no checkout at {tmp_path / 'no-comfyui'}" in line
    assert ("git clone not tried" if no_clone else "git clone of v0.33.0 failed (no network?)") in line
    assert f"no snapshot {tmp_path / 'no-snapshots'}/ComfyUI-0.33.0.tar.gz" in line
    # how to get it: each of the three ways
    assert "COMFYUI_PATH=" in line and "network access" in line and "STEADFAST_SNAPSHOTS=" in line
    assert not (tmp_path / "venv").exists()  # stopped before making anything


def test_the_other_row_names_its_version(tmp_path: Path) -> None:
    proc = _run(tmp_path, STEADFAST_COMFYUI="0.8.0", STEADFAST_NO_CLONE="1")
    assert proc.returncode == 3 and "ComfyUI 0.8.0 is missing" in proc.stderr
    assert "ComfyUI-0.8.0.tar.gz" in proc.stderr
