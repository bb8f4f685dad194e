"""Compile that never surprises: zero silent recompiles in real ComfyUI workflows over HTTP.

Dynamo keeps compiled code per code object for the whole process (all records and backends share
``BasicTransformerBlock.forward``'s cache entries and its ``recompile_limit``), so each scenario
runs on its OWN fresh server: what is counted here cannot come from another test module.

Backend ``eager`` (Dynamo tracing only): guards, and so recompiles, do not depend on the backend
(``tests/comfy/test_compile_cache_server.py`` runs inductor). Counts come from the sampler's run
record (per run) and ``GET /steadfast/compile_state`` (per model), as a user would read them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfy_server import ComfyServer, PromptFailed
from recompile_workflows import go, server_with_lora
from steadfast_workflows import compile_records, text
from tiny_sd15 import CHECKPOINT_NAME as TINY_CKPT_NAME  # headless/ is on sys.path (tests/comfy/conftest.py)

pytestmark = pytest.mark.comfyui

LORA = "steadfast_recompile_lora.safetensors"
PROMPTS = [
    "a lighthouse on a cliff at dawn, oil painting",
    "a harbour at night, watercolour",
    "a red fox in the snow, photograph",
]
STRENGTHS = [1.0, 0.25, 0.5, 0.75, 1.0, 0.1, 0.9, 0.6, 0.3, 0.8]


@pytest.fixture(scope="module")
def server(comfyui_path: Path, tiny_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComfyServer]:
    with server_with_lora(comfyui_path, tiny_ckpt, tmp_path_factory.mktemp("recompile_lora"), LORA) as srv:
        yield srv


@pytest.fixture(scope="module")
def lora_runs(server: ComfyServer) -> dict[str, Any]:
    """No LoRA -> load -> strength change -> /free -> same strength -> unload; then 10 runs varying
    seed, prompt and strength. Optimize: regional compile, eager backend, SDPA auto."""
    out: dict[str, Any] = {
        "base": go(server),
        "lora_1.0": go(server, lora=(LORA, 1.0)),
        "lora_0.5": go(server, lora=(LORA, 0.5)),
    }
    out["records_before_free"] = compile_records(server)
    server.free()
    out["lora_0.5_after_free"] = go(server, lora=(LORA, 0.5))
    out["unloaded"] = go(server)
    out["ten"] = [go(server, seed=100 + i, prompt=PROMPTS[i % 3], lora=(LORA, STRENGTHS[i])) for i in range(10)]
    out["records"] = compile_records(server)
    return out


def test_lora_load_strength_unload_zero_recompiles(lora_runs: dict[str, Any]) -> None:
    names = ["base", "lora_1.0", "lora_0.5", "lora_0.5_after_free", "unloaded"]
    for name in names:
        comp = lora_runs[name]["compile"]
        assert comp["recompiles_this_run"] == 0, (name, comp["recompile_reasons_this_run"])
        assert comp["recompiles"] == 0 and comp["status"] == "warm" and comp["disabled"] is False, name
        # ComfyUI really patched in place on our clone (Parameter objects of the compiled blocks kept)
        assert comp["weight_inplace_update"] is True and comp["params_replaced_this_run"] == 0, name
        assert "this run: 0 recompile(s)" in text(lora_runs[name]["entry"], "samp")
    (first,) = lora_runs["records_before_free"]
    assert first["graphs"] >= 1 and first["recompiles"] == [] and first["params_replaced"] == 0
    assert [r["recompiles"] for r in first["run_log"]] == [0, 0, 0]
    # /free reloads the checkpoint (a new model object, a new record): it compiles nothing
    assert lora_runs["lora_0.5_after_free"]["compile"]["graphs"] == 0
    h = {n: lora_runs[n]["hash"] for n in names}
    assert len({h["base"], h["lora_1.0"], h["lora_0.5"]}) == 3  # the LoRA acts, and its strength too
    assert h["lora_0.5_after_free"] == h["lora_0.5"]  # same LoRA on a reloaded model: same bits
    assert h["unloaded"] == h["base"]  # unload restores the weights exactly (in-place backup copy)


def test_ten_varied_runs_zero_recompiles(lora_runs: dict[str, Any]) -> None:
    ten = lora_runs["ten"]
    counts = [r["compile"]["recompiles_this_run"] for r in ten]
    assert counts == [0] * 10
    assert all(r["compile"]["params_replaced_this_run"] == 0 and r["compile"]["graphs"] == 0 for r in ten)
    assert len({r["hash"] for r in ten}) == 10  # every run really differs
    records = lora_runs["records"]
    assert all(rec["recompiles"] == [] and rec["fallbacks"] == [] for rec in records)
    assert sum(run["recompiles"] for rec in records for run in rec["run_log"]) == 0
    # the reloaded model's record counted every run since /free: 1 + 1 (unloaded) + 10
    assert [r["recompiles"] for r in records[-1]["run_log"]] == [0] * 12
    print(
        f"\n[recompiles] LoRA load/strength/unload/free + 10 varied runs: {sum(counts)} recompiles, "
        f"graphs compiled by the reloaded model's record: {records[-1]['graphs']}"
    )


@pytest.fixture(scope="module")
def det_runs(server: ComfyServer, lora_runs: dict[str, Any]) -> dict[str, Any]:
    """Determinism Setup toggled between runs on the compiled model (no LoRA, seed 42)."""
    out: dict[str, Any] = {"plain": go(server), "det": go(server, det=True)}
    out["plain_again"] = go(server)
    out["det_again"] = go(server, det=True)
    try:  # warn-only determinism is a different global state: strict mode must refuse to recompile
        go(server, det=False, strict=True)
        out["strict_error"] = None
    except PromptFailed as e:
        out["strict_error"] = e
    out["after_error"] = go(server)
    out["records"] = compile_records(server)
    return out


def test_flag_change_named_as_recompile_reason(det_runs: dict[str, Any]) -> None:
    det = det_runs["det"]["compile"]
    assert det["recompiles_this_run"] == 1
    (reason,) = det["recompile_reasons_this_run"]
    # Determinism Setup turns on deterministic algorithms and turns off reduced-precision reductions
    assert reason.startswith("global flag changed since compile: ")
    assert "deterministic_algorithms False -> True" in reason
    assert "recompiled: global flag changed since compile" in text(det_runs["det"]["entry"], "samp")
    event = next(e for rec in det_runs["records"] for e in rec["recompiles"] if e["reason"] == reason)
    assert event["cause"] == "global_flag" and "GLOBAL_STATE changed: deterministic_algorithms" in event["guard"]
    # both graphs stay cached: toggling back and forth recompiles nothing
    for name in ("plain", "plain_again", "det_again", "after_error"):
        assert det_runs[name]["compile"]["recompiles_this_run"] == 0, name
    # eager backend, CPU: deterministic mode changes no bits here (measured, same seed and prompt)
    assert len({det_runs[n]["hash"] for n in ("plain", "det", "plain_again", "det_again")}) == 1


def test_strict_recompiles_fails_with_the_flag_as_reason(det_runs: dict[str, Any]) -> None:
    err = det_runs["strict_error"]
    assert err is not None, "strict_recompiles did not fail on a recompile after warm-up"
    assert err.node_id == "samp" and "RecompileError" in (err.exception_type or "")
    assert "recompiled after warm-up" in err.exception_message
    assert "global flag changed since compile: deterministic_warn_only False -> True" in err.exception_message


# ------------------------------------------------------------------------------------------------
# Resolution changes, on a fresh server of their own (attention backends keep the scenarios' graphs apart)
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sizes_server(comfyui_path: Path, tiny_ckpt: Path) -> Iterator[ComfyServer]:
    with ComfyServer({TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path) as srv:
        yield srv


@pytest.fixture(scope="module")
def size_runs(sizes_server: ComfyServer) -> dict[str, Any]:
    s = sizes_server
    out: dict[str, Any] = {}
    # dynamic=auto (torch's default): Warmup at two sizes, then other sizes, then another batch
    out["auto_warm"] = go(s, attention="math", warm="96x64")
    out["auto"] = [go(s, attention="math", width=80, height=112)]
    out["auto_batch2"] = go(s, attention="math", batch=2)
    # dynamic=true: one Warmup size, then sizes and batch sizes
    out["true_warm"] = go(s, attention="flash", dynamic="true", warm="")
    out["true"] = [
        go(s, attention="flash", dynamic="true", width=w, height=h, batch=b)
        for w, h, b in ((96, 64, 1), (128, 128, 1), (64, 64, 2))
    ]
    out["true_record"] = max(compile_records(s), key=lambda r: r["created"])
    # dynamic=false: one graph per size until the process-wide limit: the warning must come first
    out["static"] = go(s, attention="auto", dynamic="false", warm="72x64,80x64,88x64,96x64,104x64")
    out["static_record"] = max(compile_records(s), key=lambda r: r["created"])
    return out


def test_dynamic_auto_warmup_sizes_then_no_recompile_for_new_sizes(size_runs: dict[str, Any]) -> None:
    warm = text(size_runs["auto_warm"]["entry"], "warm")
    first, second = warm.split("warmup step at latent [1, 4, 8, 12]")
    assert "warmup step at latent [1, 4, 8, 8]" in first and "0 recompile(s)" in first
    assert "run 2: 1 recompile(s)" in second and "size mismatch at index 1. expected 64, actual 96" in second
    for r in size_runs["auto"]:  # 80x112: the token dimension is dynamic now
        assert r["compile"]["recompiles_this_run"] == 0
    # the batch dimension never changed during warm-up, so it is still static under dynamic=auto
    batch2 = size_runs["auto_batch2"]["compile"]
    assert batch2["recompiles_this_run"] == 1 and "size mismatch at index 0" in batch2["recompile_reasons_this_run"][0]


def test_dynamic_true_one_compile_for_all_sizes(size_runs: dict[str, Any]) -> None:
    rec = size_runs["true_record"]
    assert rec["graphs"] == 1  # one graph for the one block type, from the Warmup
    # its only "recompile" is the first call finding the other scenario's graph (another attention backend)
    assert all("optimized_attention_override" in e["reason"] for e in rec["recompiles"])
    assert [r["compile"]["recompiles_this_run"] for r in size_runs["true"]] == [0, 0, 0]
    assert [r["compile"]["graphs"] for r in size_runs["true"]] == [1, 1, 1]
    assert sorted(map(tuple, rec["shapes_seen"])) == [(2, 4, 8, 8), (2, 4, 8, 12), (2, 4, 16, 16), (4, 4, 8, 8)]


def test_warning_before_recompile_limit_then_visible_fallback(size_runs: dict[str, Any]) -> None:
    reports = text(size_runs["static"]["entry"], "warm").split("warmup step at latent ")[1:]
    assert len(reports) == 6
    warned = next(i for i, r in enumerate(reports) if "WARNING:" in r)
    fell_back = next(i for i, r in enumerate(reports) if "fallback(s) to eager" in r)
    assert warned < fell_back
    assert "compiled variant(s) in this process, torch._dynamo.config.recompile_limit=8" in reports[warned]
    rec = size_runs["static_record"]
    assert rec["cache_entries"] == {"BasicTransformerBlock.forward": 8} and rec["recompile_limit"] == 8
    assert any(f["kind"] == "recompile_limit" for f in rec["fallbacks"])
    assert "WARNING:" in text(size_runs["static"]["entry"], "samp")
