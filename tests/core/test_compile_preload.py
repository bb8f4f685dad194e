"""Warm start at server start (core.compile.warm.preload): when the compile stack is imported, and that it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from steadfast.core.compile.warm import preload
from steadfast.core.compile.warm.cache import FILES

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


@pytest.mark.parametrize(
    ("env", "files", "expected"),
    [
        ("", False, False),
        ("", True, True),
        ("auto", True, True),
        ("0", True, False),
        ("1", False, True),
    ],
)
def test_decide_follows_the_switch_then_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str, files: bool, expected: bool
) -> None:
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
from steadfast.core.compile.warm import preload
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
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ROOT / "scripts"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
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


_ISA_CACHE_CHILD = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from _steadfast_import import import_steadfast
import_steadfast()
from steadfast.core.compile.warm import cache as cc, preload
root = Path(sys.argv[2])
other = cc.open_cache(root, "aaa-other", device="cpu")  # sorts before "default": default is still tried first
cache = cc.open_cache(root, "default", device="cpu")
(cache.path / "ab").mkdir()
(cache.path / "ab" / "k.so").write_bytes(b"compiled")  # what an earlier compile recorded
cache.adopt({}, {"ab/k.so": cc._sha256(cache.path / "ab" / "k.so")})
def tree(c):
    return {p.relative_to(c.path).as_posix() for p in c.path.rglob("*") if p.is_file()}
before = tree(cache)
state = preload.preload(root, device="cpu")
other_files = {n for n in tree(other) - {cc.MANIFEST} if n != cc.LOCK_FILE}  # opening takes the folder's lock
print(json.dumps({"state": state, "new": sorted(tree(cache) - before), "other": sorted(other_files),
                  "recorded": sorted(cache.recorded())}))
"""


def test_the_isa_pick_at_start_runs_in_this_machines_compile_cache(tmp_path: Path) -> None:
    """Inductor builds its ISA test programs in its cache folder: at start they go into (and next time come from)
    the managed cache of this machine's key, recorded as a compile's files are (a later open finds no file it did
    not write; an artifact carries them)."""
    env = {**os.environ, preload.PRELOAD_ENV: "1"}
    out = subprocess.run(
        [sys.executable, "-c", _ISA_CACHE_CHILD, str(ROOT / "scripts"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["state"]["cpu_isa_cache"] == "default" and "not picked" not in r["state"]["cpu_isa"]
    if "avx512" in r["state"]["cpu_isa"]:  # inductor builds its AVX512 sub-feature probes (AMX, VNNI ...) there
        assert any(n.endswith(".so") for n in r["new"]), r  # built inside the activated cache
        # and recorded (locks and the cache's own hidden bookkeeping, e.g. its writers list, are never artifacts)
        assert {n for n in r["new"] if not n.endswith(".lock") and not n.split("/")[-1].startswith(".")} <= set(
            r["recorded"]
        ), r
    assert r["other"] == [] and "ab/k.so" in r["recorded"]


def test_isa_cache_takes_a_folder_that_checks_out_and_moves_nothing(tmp_path: Path) -> None:
    from steadfast.core.compile.warm import cache as cc

    assert preload.isa_cache(None, "cpu") is None and preload.isa_cache(tmp_path / "none", "cpu") is None
    good = cc.open_cache(tmp_path, "zzz", device="cpu")
    bad = cc.open_cache(tmp_path, "default", device="cpu")
    for c in (good, bad):
        (c.path / "k.so").write_bytes(b"compiled")
        c.adopt({}, {"k.so": cc._sha256(c.path / "k.so")})
    (bad.path / "k.so").write_bytes(b"garbage!")  # changed since recorded: not used, left for the first compile
    chosen = preload.isa_cache(tmp_path, "cpu")
    assert chosen is not None and chosen.name == "zzz"
    assert (bad.path / "k.so").read_bytes() == b"garbage!" and not list(tmp_path.glob("default/*.bad-*"))
    with pytest.raises(cc.CacheRefused):  # a root clients can write is refused as open_cache refuses it
        cc.existing_cache(tmp_path, "zzz", device="cpu", forbidden=(str(tmp_path),))
    assert preload.isa_cache(tmp_path, "cpu", forbidden=(str(tmp_path),)) is None
