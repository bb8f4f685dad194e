"""core/compile/warm/cache.py: key, root resolution, manifest checks, env set/restore, and - in FRESH
processes - real inductor cache hits, plus recovery from a corrupted cache (no crash)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from steadfast.core.compile.warm import cache as cc
from steadfast.core.compile.warm import cache_location as loc

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch):
    for k in (cc.INDUCTOR_ENV, cc.TRITON_ENV, loc.CACHE_ENV):
        monkeypatch.delenv(k, raising=False)


def test_key_separates_environments():
    fields = cc.cache_key_fields("cpu")
    assert set(fields) == {"format", "torch", "triton", "python", "device", "pack", "trace"}
    assert fields["device"].startswith("cpu ") and fields["pack"] == "0.1.0"
    key = cc.cache_key(fields)
    assert key.startswith("torch") and "-cpu-" in key and all(c.isalnum() or c in "._-" for c in key)
    assert cc.cache_key(dict(fields)) == key  # stable
    for name, value in (
        ("torch", "9.9.9"),
        ("device", "cuda NVIDIA H100 sm90"),
        ("pack", "0.2.0"),
        ("triton", "triton 3.5.0"),
        ("python", "CPython 3.12"),
    ):
        assert cc.cache_key({**fields, name: value}) != key, name
    # issue 45: the SDPA switches decide the kernels inductor lowers, and torch's own cache keys leave them out
    flash = torch.backends.cuda.flash_sdp_enabled()
    torch.backends.cuda.enable_flash_sdp(not flash)
    try:
        assert cc.cache_key(cc.cache_key_fields("cpu")) != key
    finally:
        torch.backends.cuda.enable_flash_sdp(flash)
    assert cc.cache_key(cc.cache_key_fields("cpu")) == key


def test_root_is_the_operators(clean_env, monkeypatch, tmp_path):
    assert loc.resolve_root(tmp_path) == (tmp_path / "steadfast" / "compile_cache", "ComfyUI user directory")
    assert loc.resolve_root(None)[0] is None
    monkeypatch.setenv(loc.CACHE_ENV, str(tmp_path / "env"))
    assert loc.resolve_root(tmp_path) == (tmp_path / "env", f"${loc.CACHE_ENV}")
    monkeypatch.setenv(loc.CACHE_ENV, "none")
    root, why = loc.resolve_root(tmp_path)
    assert root is None and "disabled" in why


def test_manifest_mismatch_and_corruption_are_moved_aside(tmp_path):
    cache = cc.open_cache(tmp_path, device="cpu")
    assert cache is not None and cache.messages == []
    manifest = json.loads((cache.path / cc.MANIFEST).read_text())
    assert manifest["key"] == cache.key and manifest["fields"] == cache.fields
    (cache.path / "fxgraph").mkdir()
    (cache.path / "fxgraph" / "entry").write_bytes(b"x")
    reopened = cc.open_cache(tmp_path, device="cpu").messages  # reopening keeps the entries, says they're untrusted
    assert len(reopened) == 1 and "not written while Steadfast watched" in reopened[0] and "moved" not in reopened[0]
    assert (cache.path / "fxgraph" / "entry").exists()

    manifest["fields"]["torch"] = "1.0.0"  # a directory copied from another machine / version
    (cache.path / cc.MANIFEST).write_text(json.dumps(manifest))
    again = cc.open_cache(tmp_path, device="cpu")
    assert again is not None and len(again.messages) == 1
    assert (
        "made for another environment (differs in torch)" in again.messages[0] and "moved aside" in again.messages[0]
    )
    assert not (again.path / "fxgraph").exists() and (again.path / cc.MANIFEST).exists()
    assert len(list(cache.root.glob(f"{cache.key}.bad-*"))) == 1  # kept, not deleted

    (again.path / cc.MANIFEST).write_text("{not json")
    third = cc.open_cache(tmp_path, device="cpu")
    assert third is not None and "unreadable manifest" in third.messages[0]


def test_unusable_root_gives_none(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert cc.open_cache(blocker, device="cpu") is None
    assert "running without the managed cache" in caplog.text


def test_activate_sets_and_restores(clean_env, monkeypatch, tmp_path):
    cache = cc.open_cache(tmp_path, device="cpu")
    with cache.activate() as path:
        assert os.environ[cc.INDUCTOR_ENV] == str(path.resolve())
        assert os.environ[cc.TRITON_ENV] == os.path.join(str(path.resolve()), "triton")
        with cache.activate():  # nested: unchanged
            assert os.environ[cc.INDUCTOR_ENV] == str(path.resolve())
        assert os.environ[cc.INDUCTOR_ENV] == str(path.resolve())
    assert cc.INDUCTOR_ENV not in os.environ and cc.TRITON_ENV not in os.environ  # absent before: absent after
    monkeypatch.setenv(cc.INDUCTOR_ENV, "/somewhere/else")
    with pytest.raises(RuntimeError), cache.activate():
        raise RuntimeError("boom")
    assert os.environ[cc.INDUCTOR_ENV] == "/somewhere/else" and cc.TRITON_ENV not in os.environ


def test_run_cached_retries_only_for_errors_naming_the_cache(tmp_path):
    cache = cc.open_cache(tmp_path, device="cpu")
    calls = []

    def fails_on_cached_file():
        calls.append(1)
        if len(calls) == 1:
            raise ImportError(f"{cache.path.resolve()}/ab/cab.so: file too short")
        return "ok"

    assert cc.run_cached(cache, fails_on_cached_file) == "ok" and len(calls) == 2
    assert "compile failed on a cached file" in cache.messages[-1]
    with pytest.raises(ValueError):
        cc.run_cached(cache, lambda: (_ for _ in ()).throw(ValueError("not about the cache")))
    assert len(cache.messages) == 1
    assert cc.run_cached(None, lambda: 3) == 3


# ---------------------------------------------------------------------------------------------
# Fresh processes: inductor on CPU (gcc). One small block, compiled three times in new processes.
# ---------------------------------------------------------------------------------------------
CHILD = r"""
import importlib.util, json, os, sys, time
spec = importlib.util.spec_from_file_location("steadfast", sys.argv[1] + "/__init__.py",
                                              submodule_search_locations=[sys.argv[1]])
mod = importlib.util.module_from_spec(spec); sys.modules["steadfast"] = mod; spec.loader.exec_module(mod)
import torch
from torch._dynamo.utils import counters
from steadfast.core.compile.warm import cache as cc

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)
        self.lin = torch.nn.Linear(64, 64)
    def forward(self, x):
        return x + torch.nn.functional.gelu(self.lin(self.norm(x)))

torch.manual_seed(0)
block = torch.compile(Block())
x = torch.randn(4, 64)
cache = cc.open_cache(sys.argv[2], device="cpu")
env_before = os.environ.get(cc.INDUCTOR_ENV)
t0 = time.perf_counter()
with torch.inference_mode():
    y = cc.run_cached(cache, lambda: block(x))
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "hit": counters["inductor"]["fxgraph_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"], "sum": float(y.sum()),
                  "env_restored": os.environ.get(cc.INDUCTOR_ENV) == env_before,
                  "messages": cache.messages}), flush=True)
os._exit(0)  # torch 2.11 may die at exit after compiled code ran (docs/compatibility.md, torch 2.11 exit row)
"""


def _child(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (cc.INDUCTOR_ENV, cc.TRITON_ENV, loc.CACHE_ENV)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(root)], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fresh_process_hits_and_survives_corruption(tmp_path):
    cold = _child(tmp_path)
    warm = _child(tmp_path)
    assert (cold["miss"], cold["hit"]) == (1, 0) and (warm["miss"], warm["hit"]) == (1 - 1, 1)
    assert warm["sum"] == cold["sum"] and cold["env_restored"] and warm["env_restored"]
    assert cold["messages"] == warm["messages"] == []  # all that inductor wrote was recorded while watched
    assert warm["seconds"] < cold["seconds"]
    print(
        f"\n[compile cache, fresh process, 1 block] cold {cold['seconds']:.2f} s, warm {warm['seconds']:.2f} s, "
        f"ratio {cold['seconds'] / warm['seconds']:.1f}x"
    )

    # Corrupt every cached file: graph entries (inductor skips them) and compiled .so (would crash)
    (key_dir,) = [p for p in (tmp_path / loc.DEFAULT_NAME).iterdir() if p.is_dir() and ".bad-" not in p.name]
    corrupted = 0
    for f in key_dir.rglob("*"):
        if f.is_file() and f.name != cc.MANIFEST and (f.suffix == ".so" or "fxgraph" in f.parts):
            f.write_bytes(b"garbage")
            corrupted += 1
    assert corrupted >= 2
    healed = _child(tmp_path)
    assert healed["sum"] == cold["sum"]  # compiled again, same bits, no crash
    assert healed["hit"] == 0 and any("moved aside" in m for m in healed["messages"])
    assert list((tmp_path / loc.DEFAULT_NAME).glob("*.bad-*"))


# ---------------------------------------------------------------------------------------------
# Trust on write, and no file-system work in calls that compile nothing (issue 23)
# ---------------------------------------------------------------------------------------------
class _Inductor:
    """Stands in for a compile: bumps the activity counter the cache watches and writes ``files`` into the active
    folder (as inductor does under ``TORCHINDUCTOR_CACHE_DIR``)."""

    def __init__(self, monkeypatch):
        self.activity = 0
        monkeypatch.setattr(cc.torch_compat, "compile_activity", lambda: self.activity)

    def compile(self, cache, files: dict[str, bytes]):
        def fn():
            self.activity += 1
            for rel, data in files.items():
                target = Path(os.environ[cc.INDUCTOR_ENV]) / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            return "compiled"

        return cc.run_cached(cache, fn)


def _recorded(cache) -> dict:
    return json.loads((cache.path / cc.FILES).read_text()) if (cache.path / cc.FILES).exists() else {}


def test_steady_calls_touch_no_files(monkeypatch, tmp_path):
    """A call that compiles nothing walks no folder and reads no record, even with 3,000 files in the cache."""
    ind = _Inductor(monkeypatch)
    cache = cc.open_cache(tmp_path, device="cpu")
    ind.compile(cache, {"fxgraph/ab/entry": b"graph", "cd/kernel.so": b"\x7fELF..."})
    assert set(_recorded(cache)) == {"fxgraph/ab/entry", "cd/kernel.so"}
    for i in range(3000):
        (cache.path / "cd" / f"k{i}.py").write_bytes(b"x")
    walks = []
    real_walk = cc._walk
    monkeypatch.setattr(cc, "_walk", lambda c: walks.append(1) or real_walk(c))
    for _ in range(20):
        assert cc.run_cached(cache, lambda: 7) == 7
    assert walks == []  # steady: no rglob, no stat, no record read
    ind.compile(cache, {"ef/new.py": b"new"})
    assert len(walks) == 1 and "ef/new.py" in _recorded(cache)  # a compiling call records once


def test_same_size_corruption_with_kept_mtime_is_caught_at_open(monkeypatch, tmp_path):
    ind = _Inductor(monkeypatch)
    cache = cc.open_cache(tmp_path, device="cpu")
    ind.compile(cache, {"cd/kernel.so": b"AAAAAAAA"})
    f = cache.path / "cd" / "kernel.so"
    st = f.stat()
    f.write_bytes(b"AAAABAAA")  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back (only the ctime tells)
    assert f.stat().st_mtime_ns == st.st_mtime_ns and f.stat().st_size == st.st_size
    again = cc.open_cache(tmp_path, device="cpu")
    assert len(again.messages) == 1 and "cd/kernel.so: checksum differs" in again.messages[0]
    assert not (again.path / "cd").exists() and list(cache.root.glob(f"{cache.key}.bad-*"))


def test_a_touched_but_unchanged_file_stays_trusted(monkeypatch, tmp_path):
    """A copy of the folder (new ctimes, same bytes) is read once and kept, not moved aside."""
    ind = _Inductor(monkeypatch)
    cache = cc.open_cache(tmp_path, device="cpu")
    ind.compile(cache, {"cd/kernel.so": b"AAAAAAAA"})
    f = cache.path / "cd" / "kernel.so"
    f.write_bytes(f.read_bytes())
    assert cc.open_cache(tmp_path, device="cpu").messages == []
    assert _recorded(cache)["cd/kernel.so"][:3] == [f.stat().st_size, f.stat().st_mtime_ns, f.stat().st_ctime_ns]


def test_file_changed_while_the_server_runs_is_quarantined_not_rerecorded(monkeypatch, tmp_path):
    ind = _Inductor(monkeypatch)
    cache = cc.open_cache(tmp_path, device="cpu")
    ind.compile(cache, {"cd/kernel.so": b"AAAAAAAA"})
    good = _recorded(cache)["cd/kernel.so"]
    f = cache.path / "cd" / "kernel.so"
    st = f.stat()
    f.write_bytes(b"AAAABAAA")  # changed between model calls, by something that is not inductor under our watch
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    time.sleep(cc.WATCH_SLACK_NS / 1e9 + 0.05)  # before the next call's watch starts
    ind.compile(cache, {"ef/other.py": b"new"})  # the next compiling call (e.g. a new shape) records
    assert len(cache.messages) == 1 and "cd/kernel.so: checksum differs" in cache.messages[0]
    assert "moved aside" in cache.messages[0]
    (bad,) = cache.root.glob(f"{cache.key}.bad-*")
    kept = json.loads((bad / cc.FILES).read_text())
    assert kept["cd/kernel.so"] == good  # the record that was moved aside still holds the good checksum
    assert "cd/kernel.so" not in _recorded(cache)  # never re-recorded as good


def test_foreign_file_is_not_recorded_as_trusted(monkeypatch, tmp_path):
    ind = _Inductor(monkeypatch)
    cache = cc.open_cache(tmp_path, device="cpu")
    ind.compile(cache, {"cd/kernel.so": b"AAAAAAAA"})
    (cache.path / "zz").mkdir()
    (cache.path / "zz" / "planted.so").write_bytes(b"not ours")
    time.sleep(cc.WATCH_SLACK_NS / 1e9 + 0.05)
    ind.compile(cache, {"ef/other.py": b"new"})
    assert set(_recorded(cache)) == {"cd/kernel.so", "ef/other.py"} and cache.messages == []
    reopened = cc.open_cache(tmp_path, device="cpu")
    assert len(reopened.messages) == 1
    assert "1 file(s) not written while Steadfast watched (e.g. zz/planted.so): not checked" in reopened.messages[0]
    assert "zz/planted.so" not in _recorded(reopened)


def test_record_of_an_earlier_version_is_checked_by_checksum(tmp_path):
    """Records written before the ctime field ([size, mtime_ns, sha256]) are read and upgraded, or caught."""
    cache = cc.open_cache(tmp_path, device="cpu")
    (cache.path / "ok.so").write_bytes(b"good")
    (cache.path / "bad.so").write_bytes(b"evil")
    st_ok, st_bad = (cache.path / "ok.so").stat(), (cache.path / "bad.so").stat()
    (cache.path / cc.FILES).write_text(
        json.dumps(
            {"ok.so": [st_ok.st_size, st_ok.st_mtime_ns, cc._sha256(cache.path / "ok.so")], "gone.so": [1, 1, "00"]}
        )
    )
    assert (
        cc.open_cache(tmp_path, device="cpu")
        .messages[0]
        .startswith("compile cache 'default': 1 file(s) not written while Steadfast watched (e.g. bad.so)")
    )
    assert _recorded(cache) == {
        "ok.so": [st_ok.st_size, st_ok.st_mtime_ns, st_ok.st_ctime_ns, cc._sha256(cache.path / "ok.so")]
    }
    (cache.path / cc.FILES).write_text(json.dumps({"bad.so": [st_bad.st_size, st_bad.st_mtime_ns, "0" * 64]}))
    assert "bad.so: checksum differs" in cc.open_cache(tmp_path, device="cpu").messages[0]
