"""Persistent compile cache across ComfyUI restarts: cold vs warm first call, in FRESH processes.

One server, started twice with the same base directory, so the default cache location
``<base>/user/steadfast/compile_cache/default/<key>`` (ComfyUI's user directory) is the same: the second
process has Dynamo's in-memory caches empty but inductor's FX-graph cache on disk. Inductor regional
compile of the tiny SD1.5 (4 BasicTransformerBlocks, one graph), LoRA loaded, Warmup compiles; the precompiled
route is off here (``STEADFAST_PRECOMPILED=0``): these tests are about the jit path's cache.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfy_server import ComfyServer
from recompile_workflows import go, server_with_lora
from steadfast_workflows import compile_records, text

pytestmark = pytest.mark.comfyui

LORA = "steadfast_cache_lora.safetensors"


def _key_dirs(server: ComfyServer) -> list[Path]:
    root = server.base_dir / "user" / "steadfast" / "compile_cache" / "default"
    return [p for p in root.iterdir() if p.is_dir() and ".bad-" not in p.name]


def _record(server: ComfyServer) -> dict[str, Any]:
    return max(compile_records(server), key=lambda r: r["created"])


@pytest.fixture(scope="module")
def cache_server(
    comfyui_path: Path, tiny_ckpt: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ComfyServer]:
    # the jit path's inductor cache (the precompiled route, on by default on torch 2.14, would answer the warm
    # start without it: tests/comfy/test_precompiled_server.py)
    with server_with_lora(
        comfyui_path, tiny_ckpt, tmp_path_factory.mktemp("cache_lora"), LORA, env={"STEADFAST_PRECOMPILED": "0"}
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def cold_warm(cache_server: ComfyServer) -> dict[str, Any]:
    s = cache_server
    inductor = {"backend": "inductor", "warm": "", "lora": (LORA, 1.0)}
    out: dict[str, Any] = {"cold": go(s, **inductor)}
    out["cold_warm_start"] = s.get("/steadfast/compile_state")["warm_start"]  # decided when the server started
    out["cold_record"] = _record(s)
    out["strength"] = go(s, **{**inductor, "lora": (LORA, 0.5)})
    t0 = time.perf_counter()
    s.restart()  # a fresh process: nothing compiled in memory
    out["restart_seconds"] = time.perf_counter() - t0
    out["warm"] = go(s, **inductor)
    out["warm_record"] = _record(s)
    out["warm_warm_start"] = s.get("/steadfast/compile_state")["warm_start"]
    return out


def test_cold_then_warm_start_hits_the_cache(cache_server: ComfyServer, cold_warm: dict[str, Any]) -> None:
    cold, warm = cold_warm["cold_record"], cold_warm["warm_record"]
    expected = cache_server.base_dir / "user" / "steadfast" / "compile_cache" / "default"
    assert len(_key_dirs(cache_server)) == 1 and _key_dirs(cache_server)[0].parent == expected
    for rec in (cold, warm):
        assert rec["compile_cache"] == {"name": "default", "source": "ComfyUI user directory", "messages": []}
        assert rec["status"] == "warm" and rec["disabled"] is False and rec["errors"] == []
        assert rec["graphs"] == 1 and rec["recompiles"] == []
    assert cold["compile_cache"]["name"] == warm["compile_cache"]["name"] == "default"
    # no absolute path and no cache key reach clients (they would say where to plant a poisoned cache)
    state = json.dumps(cache_server.get("/steadfast/compile_state"))
    assert str(cache_server.base_dir) not in state and _key_dirs(cache_server)[0].name not in state
    assert (
        cold["cache_state"].get("fxgraph_cache_miss", 0) >= 1 and cold["cache_state"].get("fxgraph_cache_hit", 0) == 0
    )
    assert (
        warm["cache_state"].get("fxgraph_cache_hit", 0) >= 1 and warm["cache_state"].get("fxgraph_cache_miss", 0) == 0
    )
    assert "compile cache: " in text(cold_warm["cold"]["entry"], "opt")
    # the same bits before and after the restart (compiled kernels loaded from the cache)
    assert cold_warm["warm"]["hash"] == cold_warm["cold"]["hash"]
    # the compile stack is imported at start only by the server that has compiled files to warm-start from
    assert cold_warm["cold_warm_start"]["compile_stack_preloaded"] is False
    assert "no compiled files" in cold_warm["cold_warm_start"]["reason"]
    assert cold_warm["warm_warm_start"]["compile_stack_preloaded"] is True
    assert cold_warm["warm_warm_start"]["seconds"] > 0
    # then inductor's CPU ISA picked and the heap frozen at start, before any prompt (core.compile.warm.preload)
    assert cold_warm["warm_warm_start"]["cpu_isa"] and "not picked" not in cold_warm["warm_warm_start"]["cpu_isa"]
    assert cold_warm["warm_warm_start"]["gc_frozen"] > 100_000
    assert cold_warm["cold_warm_start"]["cpu_isa"] is None and cold_warm["cold_warm_start"]["gc_frozen"] is None
    c, w = cold["first_call_seconds"], warm["first_call_seconds"]
    assert w < c
    print(
        f"\n[compile cache] inductor regional tiny SD1.5, first call (Warmup, includes compile): cold {c:.2f} s, "
        f"warm (new process, same cache dir) {w:.2f} s, ratio {c / w:.1f}x; fxgraph cache cold "
        f"{cold['cache_state']}, warm {warm['cache_state']}"
    )


def test_lora_strength_change_under_inductor_recompiles_nothing(cold_warm: dict[str, Any]) -> None:
    comp = cold_warm["strength"]["compile"]
    assert comp["recompiles_this_run"] == 0 and comp["params_replaced_this_run"] == 0
    assert cold_warm["strength"]["hash"] != cold_warm["cold"]["hash"]


@pytest.mark.slow
def test_corrupt_cached_kernel_recovers_over_http(cache_server: ComfyServer, cold_warm: dict[str, Any]) -> None:
    """A corrupt compiled .so makes inductor fail to load it; the cache is moved aside, the call retried."""
    (cache_dir,) = _key_dirs(cache_server)
    corrupted = [p for p in cache_dir.rglob("*.so")]
    assert corrupted
    for p in corrupted:
        p.write_bytes(b"garbage")
    cache_server.restart()
    again = go(cache_server, backend="inductor", warm="", lora=(LORA, 1.0), timeout=900)
    rec = _record(cache_server)
    assert again["hash"] == cold_warm["cold"]["hash"] and rec["disabled"] is False
    assert any("moved aside" in m for m in rec["compile_cache"]["messages"])
    assert any("moved aside" in w for w in rec["warnings"])
    assert list(cache_dir.parent.glob(f"{cache_dir.name}.bad-*"))
