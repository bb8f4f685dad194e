"""Tests for core/compile/registry.py: per-model compile records, recompile attribution, weak keying, JSON.

All compiles use ``backend="eager"`` (Dynamo tracing only): graphs, guards and recompiles behave as
with inductor, without a C++ compiler. Each test uses its own CompileRegistry and closes it.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import re
import time
from pathlib import Path

import pytest
import torch
from tiny_modules import Block, Tiny, block_paths
from torch._dynamo.utils import counters

from steadfast.core.compile.guards import SkipGuardsOn
from steadfast.core.compile.options import CompileOptions
from steadfast.core.compile.recompiles import FullgraphBreakError
from steadfast.core.compile.record import CompileRecord, CompileStats
from steadfast.core.compile.registry import REGISTRY, CompileRegistry, RecompileError
from steadfast.core.compile.swap import swap_in

STATIC = CompileOptions(backend="eager", dynamic=False)
ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def call(reg: CompileRegistry, m: Tiny, rec: CompileRecord, x: torch.Tensor) -> torch.Tensor:
    with reg.track(rec, shape=x), swap_in(m, rec.compiled):
        return m(x)


def register(reg: CompileRegistry, m: Tiny, options: CompileOptions = STATIC, **kw):
    return reg.get_or_create(m, options, block_paths(m), **kw)


def test_process_registry_lists_records_and_marks_them_released_with_the_model():
    m = Tiny(n=2)
    rec, created = REGISTRY.get_or_create(m, STATIC, block_paths(m), label="process-wide probe")
    try:
        assert created and REGISTRY.get(m) is rec
        listed = [r for r in REGISTRY.as_json()["records"] if r["label"] == "process-wide probe"]
        assert [r["status"] for r in listed] == ["cold"]
    finally:
        del m, rec
        gc.collect()
    listed = [r for r in REGISTRY.as_json()["records"] if r["label"] == "process-wide probe"]
    assert [r["status"] for r in listed] == ["released"]  # the model is gone, its record is not forgotten


def test_released_record_keeps_compile_seconds_recompiles_reasons_and_says_next_run(reg):
    """Issue 37: a freed model's record stays in ``as_json``, marked released, with what it compiled."""
    m = Tiny(n=3)
    rec, _ = register(reg, m, label="released probe")
    call(reg, m, rec, torch.randn(1, 4, 8))
    call(reg, m, rec, torch.randn(1, 6, 8))  # a recompile with its reason
    seconds, reason = rec.stats.first_call_seconds, rec.stats.recompiles[0]["reason"]
    created = rec.created
    assert len(reg) == 1 and reg.released() == []
    del m, rec
    gc.collect()
    assert len(reg) == 0  # no live record: the model is gone
    (view,) = reg.as_json()["records"]
    assert view == reg.released()[0]
    assert view["label"] == "released probe" and view["created"] == created and view["released"] >= created
    assert view["status"] == "released" and view["status_at_release"] == "warm"
    assert view["compile_seconds"] == seconds > 0 and view["first_call_seconds"] == seconds
    assert view["recompile_count"] == 1 and view["recompile_reasons"] == [reason] and "size mismatch" in reason
    assert view["graphs"] == 2 and view["calls"] == 2 and view["block_count"] == 3
    # eager: Dynamo's code for Block.forward stays in this process; nothing on disk for a restart
    assert view["warm_in_this_process"] is True and view["warm_from_compile_cache"] is False
    assert view["next_run"].startswith("in this process: warm") and "backend 'eager'" in view["next_run"]
    json.dumps(view)


def test_released_records_are_bounded_to_the_last_32(reg):
    from steadfast.core.compile.registry import RELEASED_KEPT

    assert RELEASED_KEPT == 32
    for i in range(RELEASED_KEPT + 5):
        m = Tiny(n=1)
        register(reg, m, label=f"model {i}")
        del m
        gc.collect()
    labels = [r["label"] for r in reg.as_json()["records"]]
    assert labels == [f"model {i}" for i in range(5, RELEASED_KEPT + 5)]
    assert reg.as_json()["released_kept"] == RELEASED_KEPT


def test_replaced_record_is_not_reported_as_released(reg):
    """New options replace a live model's record: only the record in use when the model goes is kept."""
    m = Tiny(n=2)
    register(reg, m, label="first")
    register(reg, m, CompileOptions(backend="eager", dynamic=True), label="second")
    gc.collect()
    assert reg.released() == []
    del m
    gc.collect()
    assert [r["label"] for r in reg.released()] == ["second"]


def test_next_run_says_when_the_compile_cache_makes_a_restart_warm():
    """Inductor with Steadfast's compile cache: warm after a restart too; without it, or cold records, not."""
    from steadfast.core.compile.registry import next_run

    def record(backend: str, **stats) -> CompileRecord:
        return CompileRecord(
            label="x", blocks=("b",), options={"backend": backend}, compiled={}, stats=CompileStats(**stats)
        )

    warm = dict(status="warm", graphs=1)
    here, cached, text = next_run(record("inductor", compile_cache={"name": "default"}, **warm))
    assert cached is True and "after a restart: warm from the compile cache 'default'" in text
    assert here is False and text.startswith("in this process: cold")  # no compiled blocks left in this record
    assert next_run(record("inductor", **warm))[1] is False  # compile_cache off
    assert next_run(record("eager", compile_cache={"name": "default"}, **warm))[1] is False
    assert next_run(record("inductor", compile_cache={"name": "d"}))[:2] == (False, False)  # never compiled
    dead = next_run(record("inductor", compile_cache={"name": "d"}, disabled=True, **warm))
    assert dead[:2] == (False, False) and "ran eager" in dead[2]


def test_record_identity_is_frozen(reg):
    m = Tiny(n=2)
    rec, _ = reg.get_or_create(m, STATIC, block_paths(m))
    for name, value in (("label", "other"), ("blocks", ()), ("stats", None)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(rec, name, value)
    assert rec.blocks == ("blocks.0", "blocks.1") and rec.label == "Tiny"


_STATS = "|".join(f.name for f in dataclasses.fields(CompileStats))
_WRITE = re.compile(
    rf"\.stats\.(?:{_STATS})\b\s*(?:[+-]?=(?!=)|\[[^\]]*\]\s*[+-]?=(?!=)|"
    r"\.(?:append|extend|add|update|clear|pop|discard|remove)\()"
)


def stats_writes(folders=("core", "nodes", "headless", "benchmarks", "scripts")) -> dict[str, list[int]]:
    """``{file: [line numbers]}`` of lines writing a record's ``stats`` field, outside ``core/compile/registry.py``."""
    hits = {}
    for folder in folders:
        for f in sorted((ROOT / folder).rglob("*.py")):
            rel = str(f.relative_to(ROOT))
            lines = [i for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if _WRITE.search(line)]
            if lines and rel != "core/compile/registry.py":
                hits[rel] = lines
    return hits


def test_only_the_registry_writes_record_statistics():
    assert _WRITE.search("record.stats.graphs += 1") and _WRITE.search("rec.stats.warnings.append(t)")
    assert _WRITE.search("rec.stats.cache_state[k] = 1") and not _WRITE.search("x = rec.stats.graphs == 1")
    registry_src = (ROOT / "core" / "compile" / "registry.py").read_text(encoding="utf-8")
    assert any(_WRITE.search(line) for line in registry_src.splitlines())  # the scanner sees the real writes
    assert stats_writes() == {}


def test_first_call_warms_and_records(reg):
    m = Tiny(n=3)
    rec, created = register(reg, m, label="tiny")
    assert created and rec.stats.status == "cold" and rec.stats.first_call_seconds is None
    assert rec.blocks == ("blocks.0", "blocks.1", "blocks.2")
    x = torch.randn(2, 5, 8)
    t0 = time.perf_counter()
    out = call(reg, m, rec, x)
    wall = time.perf_counter() - t0
    assert torch.equal(out, m(x))
    # the record times the tracked call itself (compile + run), in seconds: inside what the caller measured
    assert rec.stats.status == "warm" and 0 < rec.stats.first_call_seconds <= wall
    assert rec.stats.graphs == 1  # 3 identical blocks, one shared graph
    assert rec.stats.calls == 1 and rec.stats.runs == 1 and rec.stats.shapes_seen == {(2, 5, 8)}
    assert rec.stats.recompiles == [] and rec.stats.errors == []
    call(reg, m, rec, x)
    assert rec.stats.calls == 2 and rec.stats.graphs == 1 and rec.stats.first_call_seconds is not None


def test_reregister_same_model_reuses_record_without_compiling(reg):
    m = Tiny(n=3)
    rec, created = register(reg, m, guard_filter_fn=SkipGuardsOn())
    x = torch.randn(1, 4, 8)
    call(reg, m, rec, x)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 1
    equal = CompileOptions(backend="eager", dynamic=False)  # a distinct but equal object
    again, created2 = register(reg, m, equal, guard_filter_fn=SkipGuardsOn())
    assert again is rec and not created2  # equal options + equal filter -> same record
    assert all(again.compiled[p] is rec.compiled[p] for p in rec.compiled)
    call(reg, m, again, x)
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled again
    assert rec.stats.calls == 2
    other, created3 = register(reg, m, CompileOptions(backend="eager", dynamic=True))
    assert created3 and other is not rec and reg.get(m) is other  # new settings replace the record
    assert len(reg) == 1


def test_recompile_counted_with_reason_on_shape_change(reg):
    m = Tiny(n=3)
    rec, _ = register(reg, m)
    with reg.run(rec) as run_no:
        call(reg, m, rec, torch.randn(1, 4, 8))
    assert run_no == 1
    call(reg, m, rec, torch.randn(1, 6, 8))  # track outside run(): its own run
    assert rec.stats.graphs == 2 and rec.stats.runs == 2
    assert len(rec.stats.recompiles) == 1
    event = rec.stats.recompiles[0]
    assert "size mismatch" in event["reason"] and "expected 4, actual 6" in event["reason"]
    assert event["function"].startswith("forward") and event["run"] == 2 and event["call"] == 2
    assert rec.stats.shapes_seen == {(1, 4, 8), (1, 6, 8)}
    assert "1 recompile(s) (last: tensor" in rec.as_text()
    # Dynamo's stderr output stays quiet: the tap disables propagation
    assert logging.getLogger("torch._dynamo.guards.__recompiles").propagate is False


def test_dynamic_true_avoids_recompiles_on_new_sizes(reg):
    m = Tiny(n=3)
    rec, _ = register(reg, m, CompileOptions(backend="eager", dynamic=True))
    call(reg, m, rec, torch.randn(1, 4, 8))
    # measured: with dynamic=True the FIRST call already builds 2 graphs (the first block's input is
    # a view of inp's output, the later ones are not: a guard on x._base fails once); see torch_probe section 6
    graphs_first, recompiles_first = rec.stats.graphs, len(rec.stats.recompiles)
    assert (graphs_first, recompiles_first) == (2, 1)  # observed on torch 2.14.1
    for t in (6, 9, 13):
        out = call(reg, m, rec, torch.randn(1, t, 8))
        assert out.shape == (1, t, 8)
    assert rec.stats.graphs == graphs_first and len(rec.stats.recompiles) == recompiles_first
    assert len(rec.stats.shapes_seen) == 4


def test_strict_raises_after_warm_up_only(reg):
    m = Tiny(n=3)
    rec, _ = register(reg, m, strict=True)
    call(reg, m, rec, torch.randn(1, 4, 8))  # warm-up compile: no error
    call(reg, m, rec, torch.randn(1, 4, 8))  # same shape: no recompile
    with pytest.raises(RecompileError, match="size mismatch"):
        call(reg, m, rec, torch.randn(1, 5, 8))
    assert isinstance(RecompileError("x"), RuntimeError)
    assert len(rec.stats.recompiles) == 1


def test_strict_allows_recompiles_during_warm_up(reg):
    # a recompile inside the warm-up call itself (dynamic=True, measured above) is not an error
    m2 = Tiny(n=3)
    rec2, _ = register(reg, m2, CompileOptions(backend="eager", dynamic=True), strict=True)
    call(reg, m2, rec2, torch.randn(1, 4, 8))
    assert len(rec2.stats.recompiles) == 1 and rec2.stats.status == "warm"
    call(reg, m2, rec2, torch.randn(1, 7, 8))  # dynamic: no recompile, no error


def test_recompile_limit_warning_and_fallback(reg, caplog):
    m = Tiny(n=2)
    rec, _ = register(reg, m)
    with torch._dynamo.config.patch(recompile_limit=4), caplog.at_level(logging.WARNING, "steadfast.registry"):
        for t in range(2, 8):  # 6 sizes; static shapes -> a recompile per new size until the limit
            x = torch.randn(1, t, 8)
            assert torch.allclose(call(reg, m, rec, x), m(x))
    assert len(rec.stats.recompiles) >= 2
    assert rec.stats.warnings and "recompile_limit=4" in rec.stats.warnings[0]
    assert any("recompile_limit=4" in r.getMessage() for r in caplog.records)
    # past the limit Dynamo runs the block eagerly: graphs stop at the limit, fallback is recorded
    assert rec.stats.graphs == 4
    (fallback,) = rec.stats.fallbacks
    assert fallback["kind"] == "recompile_limit" and fallback["function"].startswith("'forward'")
    assert fallback["reason"] == "tensor 'x' size mismatch at index 1. expected 5, actual 6"
    assert "fallback" in rec.as_text()


def test_error_inside_tracked_call_is_recorded(reg):
    m = Tiny(n=3)
    rec, _ = register(reg, m)
    with pytest.raises(RuntimeError):
        call(reg, m, rec, torch.randn(1, 4, 3))  # wrong feature size
    assert rec.stats.status == "cold" and rec.stats.first_call_seconds is None
    assert rec.stats.errors and "RuntimeError" in rec.stats.errors[0]["error"]
    reg.disable(rec, "adapter gave up")
    assert rec.stats.disabled and rec.stats.fallbacks[-1]["kind"] == "disabled"
    assert rec.summary()["disabled"] is True


def test_weak_keying(reg):
    m = Tiny(n=3)
    rec, _ = register(reg, m)
    call(reg, m, rec, torch.randn(1, 4, 8))
    key = type("Key", (), {})()  # explicit key object (e.g. ComfyUI's BaseModel)
    m2 = Tiny(n=3)
    rec2, _ = reg.get_or_create(m2, STATIC, ["blocks.0"], key=key)
    assert reg.get(key) is rec2 and reg.get(m2) is None
    assert len(reg) == 2
    del m, rec
    gc.collect()
    assert len(reg) == 1
    del key
    gc.collect()
    assert len(reg) == 0  # no live record; both stay listed as released (issue 37)
    assert [r["status"] for r in reg.as_json()["records"]] == ["released", "released"]


def test_nested_tracking_attributes_to_innermost(reg):
    outer_m, inner_m = Tiny(n=3), Tiny(n=2, dim=24)
    outer, _ = register(reg, outer_m)
    inner, _ = register(reg, inner_m)
    x = torch.randn(1, 4, 8)
    with reg.track(outer, shape=x):
        call(reg, inner_m, inner, x)  # inner record's graph must not be counted for outer
        with reg.track(outer):  # same record nested: pass-through
            pass
    assert inner.stats.graphs == 1 and outer.stats.graphs == 0 and outer.stats.calls == 1


def test_as_json_serialisable(reg):
    m = Tiny(n=3)
    rec, _ = register(reg, m, label="tiny")
    call(reg, m, rec, torch.randn(1, 4, 8))
    call(reg, m, rec, torch.randn(1, 5, 8))
    state = json.loads(json.dumps(reg.as_json()))
    assert state["recompile_limit"] == torch._dynamo.config.recompile_limit
    (r,) = state["records"]
    assert r["label"] == "tiny" and r["status"] == "warm" and r["block_count"] == 3
    assert r["shapes_seen"] == [[1, 4, 8], [1, 5, 8]]
    assert r["graphs"] == 2 and len(r["recompiles"]) == 1
    assert r["options"]["backend"] == "eager" and r["options"]["dynamic"] is False
    text = rec.as_text()
    assert text.startswith("tiny: 3 block(s) compiled (eager); warm; first call") and "2 graph(s)" in text
    json.dumps(rec.summary())


def test_close_restores_logging_state():
    from torch._logging import _internal as tlog

    logger = logging.getLogger("torch._dynamo.guards.__recompiles")
    before = (
        dict(tlog.log_state.log_qname_to_level),
        set(tlog.log_state.artifact_names),
        logger.propagate,
        list(logger.handlers),
    )
    r = CompileRegistry()
    m = Tiny(n=3)
    rec, _ = register(r, m)
    call(r, m, rec, torch.randn(1, 4, 8))
    assert "recompiles" in tlog.log_state.artifact_names and logger.propagate is False
    r.close()
    after = (
        dict(tlog.log_state.log_qname_to_level),
        set(tlog.log_state.artifact_names),
        logger.propagate,
        list(logger.handlers),
    )
    assert after == before


def test_graphs_shared_across_models_with_equal_settings(reg):
    """Dynamo caches per code object: a second model of the same block class reuses the graph when the
    settings are equal, and a different setting shows up as a BACKEND_MATCH recompile (measured)."""
    a, b, c = Tiny(n=3), Tiny(n=3), Tiny(n=3)
    ra, _ = register(reg, a)
    rb, _ = register(reg, b)
    x = torch.randn(1, 4, 8)
    call(reg, a, ra, x)
    call(reg, b, rb, x)
    assert (ra.stats.graphs, rb.stats.graphs) == (1, 0) and rb.stats.recompiles == []
    rc, _ = register(reg, c, CompileOptions(backend="eager", dynamic=True))
    call(reg, c, rc, x)
    assert rc.stats.graphs >= 1
    assert any("BACKEND_MATCH" in r for ev in rc.stats.recompiles for r in ev["reasons"])


class _Breaking(Block):
    """A block whose forward opens a file: Dynamo cannot trace ``open`` (a graph break)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with open(__file__, "rb") as f:
            f.read(1)
        return super().forward(x)


@pytest.mark.parametrize("fullgraph", [True, False])
def test_graph_break_under_fullgraph_names_cause_where_and_switch(reg, fullgraph: bool):
    m = Tiny(n=2)
    m.blocks[0] = _Breaking()
    rec, _ = register(reg, m, CompileOptions(backend="eager", dynamic=False, fullgraph=fullgraph))
    if not fullgraph:  # the same break without fullgraph: two graphs, no error
        call(reg, m, rec, torch.randn(1, 4, 8))
        assert rec.stats.graph_breaks
        return
    with pytest.raises(FullgraphBreakError) as info:
        call(reg, m, rec, torch.randn(1, 4, 8))
    msg = str(info.value)
    assert "fullgraph" in msg and "`open`" in msg, msg
    assert "forward (" in msg and "test_registry.py:" in msg, msg  # where: the block's forward, file and line
    assert "switch `fullgraph` off" in msg and "Optimize Model" in msg
    assert str(ROOT) not in msg  # the file by module path, not the checkout's absolute path
    assert type(info.value.__cause__).__name__ == "Unsupported"
