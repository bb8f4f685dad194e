"""ruff is clean: the house's formatter (every file as ``ruff format`` writes it), linter and import sorter,
configured in pyproject.toml ([tool.ruff]: line length 119, pycodestyle, pyflakes, isort with a section for
ComfyUI's modules, bugbear, pyupgrade, no exec/eval).

The README's test command installs the pinned ruff (scripts/setup_env.sh); without it this test fails, naming
the install, rather than skip: a lint that silently does not run would be a false pass.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_check_is_clean() -> None:
    assert importlib.util.find_spec("ruff") is not None, "ruff is not installed: pip install ruff==0.17.6"
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"ruff check found problems:\n{proc.stdout[-6000:]}{proc.stderr[-2000:]}"


def test_ruff_reads_the_house_configuration() -> None:
    """The configuration the check above runs under is the repository's (not ruff's defaults)."""
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--show-settings", "core/version.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "line_length = 119" in proc.stdout.replace("  ", " "), proc.stdout[:2000]


def test_ruff_format_is_clean() -> None:
    """Every Python file is as ``ruff format`` writes it (the formatter is enforced, as the linter is): run
    ``ruff format .`` before committing."""
    assert importlib.util.find_spec("ruff") is not None, "ruff is not installed: pip install ruff==0.17.6"
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"ruff format would change these files:\n{proc.stdout[-6000:]}{proc.stderr[-2000:]}"
