"""docs/architecture.md's list of process-wide changes is the truth: a full workflow (Determinism Setup,
Optimize with QKV fusion + channels-last + SDPA math + regional inductor compile + int8 quantize, Seeded Sampler,
Hash) run in-process changes nothing process-wide that the list does not name as kept, and everything it names
as kept is observed.

Compared: environment variables, torch's global flags and thread count, logging (level, handlers, propagate of
every logger that existed before), Dynamo and inductor config values, and the diffusion model's Parameters
(where their data lives, and their values).
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.comfyui, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1].parent
DOC = ROOT / "docs" / "architecture.md"


def documented() -> list[tuple[str, str, str]]:
    """``(key pattern, phase, after)`` rows of the table under '## Process-wide changes'."""
    text = DOC.read_text()
    section = text.split("## Process-wide changes", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|\s*(import|run)\s*\|\s*(kept|restored)\s*\|", line)
        if m:
            rows.append(m.groups())
    return rows


def changes(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    """Keys whose value changed. For config and logging only keys that existed before count (importing a torch
    module creates its loggers and config entries; that is torch's import, not a change)."""
    out: set[str] = set()
    for group in ("env", "torch", "logging", "dynamo_config", "inductor_config"):
        a, b = before.get(group, {}), after.get(group, {})
        keys = set(a) | set(b) if group in ("env", "torch") else set(a) & set(b)
        out |= {f"{group}.{k}" for k in keys if a.get(k) != b.get(k)}
    return out


@pytest.fixture(scope="module")
def state(tiny_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import os

    env = {**os.environ, "STEADFAST_COMPILE_CACHE": str(tmp_path_factory.mktemp("cc"))}
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE"):
        env.pop(name, None)  # this test process imported the pack already; the child starts clean
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("process_state_child.py")), str(ROOT), str(tiny_ckpt)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("STATE "))
    return json.loads(line[len("STATE ") :])


def _undocumented(observed: set[str], phase: str) -> list[str]:
    kept = [p for p, ph, after in documented() if ph == phase and after == "kept"]
    return sorted(k for k in observed if not any(fnmatch.fnmatchcase(k, p) for p in kept))


def _unobserved(observed: set[str], phase: str) -> list[str]:
    kept = [p for p, ph, after in documented() if ph == phase and after == "kept"]
    return sorted(p for p in kept if not any(fnmatch.fnmatchcase(k, p) for k in observed))


def test_the_list_parses() -> None:
    rows = documented()
    assert len(rows) >= 5 and {r[1] for r in rows} == {"import", "run"}


def test_import_changes_are_the_documented_ones(state: dict[str, Any]) -> None:
    observed = changes(state["before_pack"], state["after_import"])
    assert _undocumented(observed, "import") == []
    assert _unobserved(observed, "import") == []


def test_run_changes_are_the_documented_ones(state: dict[str, Any]) -> None:
    observed = changes(state["after_import"], state["after_run"])
    before, after = state["params_before"], state["params_after"]
    assert [n for n in before if before[n].split("|")[2] != after[n].split("|")[2]] == []  # values never change
    if any(before[n] != after[n] for n in before):
        observed.add("params.storage")
    assert _undocumented(observed, "run") == []
    assert _unobserved(observed, "run") == []


def test_second_run_changes_nothing_more(state: dict[str, Any]) -> None:
    assert changes(state["after_run"], state["after_second_run"]) == set()
    assert state["hashes"][0] == state["hashes"][1]  # and the bits hold
