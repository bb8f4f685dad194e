"""Warm start at server start (core.compile.preload): when the compile stack is imported, and that it is."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from steadfast.core.compile import preload
from steadfast.core.compile.cache import FILES

# inductor's ISA pick and the compile stack differ between torch 2.11 and 2.14: CI runs this on both rows
pytestmark = pytest.mark.torch_version
ROOT = Path(__file__).resolve().parents[2]


def _cache_with_record(root: Path, body: str) -> None:
    key = root / "default" / "torch2-cpu-AVX512-0123456789ab"
    key.mkdir(parents=True)
    (key / FILES).write_text(body)


def test_has_compiled_files_reads_the_file_records(tmp_path: Path) -> None:
    assert not preload.has_compiled_files(None) and not preload.has_compiled_files(tmp_path / "missing")
    _cache_with_record(tmp_path / "empty", "{}")
    assert not preload.has_compiled_files(tmp_path / "empty")  # a cache opened, nothing compiled into it
    _cache_with_record(tmp_path / "full", json.dumps({"ab/x.so": [1, 2, 3, "00"]}))
    assert preload.has_compiled_files(tmp_path / "full")


@pytest.mark.parametrize(("env", "files", "expected"), [
    ("", False, False), ("", True, True), ("auto", True, True), ("0", True, False), ("1", False, True),
])
def test_decide_follows_the_switch_then_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str,
                                                  files: bool, expected: bool) -> None:
    monkeypatch.setenv(preload.PRELOAD_ENV, env)
    _cache_with_record(tmp_path, json.dumps({"a.so": [1, 2, 3, "00"]}) if files else "{}")
    yes, why = preload.decide(tmp_path)
    assert yes is expected and why


_CHILD = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from _steadfast_import import import_steadfast
import_steadfast()
from steadfast.core.compile import preload
before = "torch._inductor.compile_fx" in sys.modules
state = preload.preload(Path(sys.argv[2]))
again = preload.preload(Path(sys.argv[2]))  # once per process
import gc
print(json.dumps({"before": before, "after": "torch._inductor.compile_fx" in sys.modules, "state": state,
                  "again": again, "frozen_now": gc.get_freeze_count()}))
"""


@pytest.mark.parametrize(("switch", "freeze"), [("1", ""), ("1", "0"), ("0", "")])
def test_preload_imports_the_compile_stack_in_a_fresh_process(tmp_path: Path, switch: str, freeze: str) -> None:
    env = {**os.environ, preload.PRELOAD_ENV: switch, preload.GC_FREEZE_ENV: freeze}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT / "scripts"), str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["before"] is False  # importing the pack does not import inductor's compiler
    assert r["after"] is (switch == "1") and r["state"]["compile_stack_preloaded"] is (switch == "1")
    assert r["again"] == r["state"]
    if switch == "1":
        assert r["state"]["seconds"] > 0.05  # a real import happened (0.7-1.3 s measured)
        import torch._inductor.cpu_vec_isa as isa  # the pick inductor makes here, in this process (same machine)

        from steadfast.core import torch_compat
        with torch_compat.trusted_cpu_isa():
            assert r["state"]["cpu_isa"] == str(isa.pick_vec_isa())
        assert r["state"]["cpu_isa_seconds"] >= 0
    else:
        assert r["state"]["cpu_isa"] is None and r["state"]["gc_frozen"] is None
    if switch == "1" and freeze != "0":  # the heap held at start is frozen: torch and the compile stack at least
        assert r["state"]["gc_frozen"] > 100_000  # (a frozen object freed since leaves the permanent generation)
        assert r["state"]["gc_frozen"] * 0.99 < r["frozen_now"] <= r["state"]["gc_frozen"]
    else:
        assert r["state"]["gc_frozen"] is None and r["frozen_now"] == 0
