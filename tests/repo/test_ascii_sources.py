"""Python sources are plain ASCII: tools that read them as cp1252 (comfy-test on Windows) must not choke.

Non-ASCII text a user sees is written with escapes (``"\\u2026"``), which the interpreter turns into the
character at run time.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_tracked_python_file_is_ascii() -> None:
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert files, "git ls-files found no Python files"
    offenders = []
    for name in files:
        for n, line in enumerate((ROOT / name).read_bytes().splitlines(), 1):
            if any(b > 0x7F for b in line):
                offenders.append(f"{name}:{n}: {line.decode('utf-8', 'replace').strip()[:80]}")
    assert not offenders, "non-ASCII characters in Python sources:\n" + "\n".join(offenders)
