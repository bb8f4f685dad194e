"""Optimize Model, Warmup and the compile registry through the HTTP API of a real ComfyUI server.

Compile backends: ``eager`` (Dynamo tracing only, runs the same ATen ops, so it must equal the
uncompiled model bit for bit) for speed, plus one ``inductor`` case (generates C++ with gcc).

Dynamo keeps compiled code per code object for the whole server process (every record, backend and attention
shares ``BasicTransformerBlock.forward``'s cache entries), so this module runs on its OWN server (the
``comfy_server`` fixture below), as tests/comfy/test_recompiles.py does: what is counted here cannot come from
another module. On the session's server a module that ran the templates as shipped (inductor, attention auto:
tests/comfy/test_cached_reports.py) left code whose guards all pass for the eager compile here, and Dynamo counted
that compile as a recompile ("BACKEND_MATCH failure", different backend callables): the compile-state test failed
or passed by which modules ran before it. Within the module each test that needs a *first* compile uses its own
configuration: attention auto (compile-state test, the module's first compile), flash (Warmup test), math
(attention and LoRA tests; never asserted to be a first compile).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfy_server import ComfyServer
from steadfast_workflows import (
    add,
    build_lora,
    cached_nodes,
    check_ui_lists,
    compare_of,
    compile_records,
    hash_of,
    only,
    record_of,
    run,
    text,
    workflow,
)
from tiny_sd15 import CHECKPOINT_NAME as TINY_CKPT_NAME  # headless/ is on sys.path (tests/comfy/conftest.py)

pytestmark = pytest.mark.comfyui

STEPS = 3
N_BLOCKS = 4  # BasicTransformerBlocks of the tiny SD1.5 UNet (one level): 1 input, 1 middle, 2 output


def optimized(**optimize: Any) -> dict[str, Any]:
    """optimized_vs_baseline with the Optimize node (13) updated; eager regional compile by default."""
    wf = workflow("optimized_vs_baseline", steps=STEPS)
    wf["13"]["inputs"].update({"backend": "eager", **optimize})
    return wf


def latest_record(server: ComfyServer, backend: str) -> dict[str, Any]:
    records = [r for r in compile_records(server) if r["options"]["backend"] == backend]
    assert records, f"no {backend} record in /steadfast/compile_state"
    return max(records, key=lambda r: r["created"])


@pytest.fixture(scope="module")
def comfy_server(comfyui_path: Path, tiny_ckpt: Path) -> Iterator[ComfyServer]:
    """This module's own ComfyUI server (in place of the session's, tests/comfy/conftest.py, same options: the
    tiny checkpoint, ``--cache-classic``): nothing was compiled in its process before this module's tests."""
    with ComfyServer({TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path, extra_args=["--cache-classic"]) as server:
        yield server


@pytest.fixture(scope="module")
def eager_auto(comfy_server: ComfyServer) -> dict[str, Any]:
    """optimized_vs_baseline, eager regional compile, qkv fusion, SDPA auto: twice, /free before each."""
    wf = optimized()
    out: dict[str, Any] = {}
    for i in (1, 2):
        comfy_server.free()
        out[f"run{i}"] = run(comfy_server, wf)
        out[f"record{i}"] = latest_record(comfy_server, "eager")
    return out


def test_compiled_eager_is_run_to_run_identical(eager_auto: dict[str, Any]) -> None:
    first, second = eager_auto["run1"], eager_auto["run2"]
    assert cached_nodes(second) == []
    assert hash_of(first, "11") == hash_of(second, "11")
    for entry in (first, second):
        check_ui_lists(entry)
    for node in ("10", "14"):  # baseline vs optimized: images and latents
        assert compare_of(first, node) == compare_of(second, node)
    img = compare_of(first, "10")
    # both sides run SDPA (the baseline's is pinned by Determinism Setup's batch_invariant), QKV fusion is
    # bit-equal in fp32 and the eager backend runs the same ATen ops: the optimized image is the baseline's
    assert img["identical"] is True and img["max_abs"] == 0
    assert text(first, "10").startswith("IDENTICAL (bit-exact) image")
    report = text(first, "13")
    assert "qkv_fusion: 8 attention modules fused" in report
    assert f"compile: regional, {N_BLOCKS} blocks" in report and "BasicTransformerBlock" in report


def test_compile_state_route_and_no_second_compile(eager_auto: dict[str, Any]) -> None:
    rec1, rec2 = eager_auto["record1"], eager_auto["record2"]
    assert rec1["block_count"] == N_BLOCKS and all(".transformer_blocks." in b for b in rec1["blocks"])
    assert rec1["options"]["fullgraph"] is False and "TransformerOptionsGuardFilter" in rec1["options"]["guard_filter"]
    assert rec1["status"] == "warm" and rec1["disabled"] is False and rec1["first_call_seconds"] > 0
    assert rec1["graphs"] >= 1
    # the first compile of these blocks in this module's server process: nothing to recompile from (before, on the
    # session's server, another module's inductor code for the same blocks made this a BACKEND_MATCH recompile)
    assert rec1["recompiles"] == [], [r["reason"] for r in rec1["recompiles"]]
    # batch_invariant (Determinism Setup's default): cond and uncond are separate batch-1 calls, every step
    assert rec1["calls"] == 2 * STEPS and rec1["shapes_seen"] == [[1, 4, 8, 8]]
    # after /free the checkpoint is reloaded (a new model object, so a new record), but nothing compiles:
    assert rec2["created"] > rec1["created"]
    assert rec2["graphs"] == 0 and rec2["recompiles"] == [] and rec2["fallbacks"] == []
    assert rec2["calls"] == 2 * STEPS and rec2["status"] == "warm"
    shown = record_of(eager_auto["run2"], "7")["fingerprint"]["compile"]
    assert (shown["graphs"], shown["recompiles"], shown["backend"]) == (0, 0, "eager")
    assert "compile regional (eager): warm, 0 graph(s), 0 recompile(s)" in text(eager_auto["run2"], "7")


def test_eager_compile_equals_uncompiled_and_fusion_ran(comfy_server: ComfyServer, eager_auto: dict[str, Any]) -> None:
    entry = run(comfy_server, optimized(compile="off"))
    assert hash_of(entry, "11") == hash_of(eager_auto["run1"], "11")
    fusion = record_of(entry, "7")["details"]["qkv_fusion"]
    assert (fusion["modules"], fusion["live_after_run"]) == (8, 8)
    # each block: self-attention q/k/v from one matmul, cross-attention k/v from one matmul, every model call
    # (two per step: cond and uncond evaluated alone under batch_invariant)
    assert fusion["calls_this_run"] == {"qkv": N_BLOCKS * 2 * STEPS, "kv": N_BLOCKS * 2 * STEPS, "separate": 0}


def test_qkv_fusion_is_bit_equal_in_fp32(comfy_server: ComfyServer) -> None:
    entry = run(comfy_server, optimized(attention="comfy", compile="off"))
    assert compare_of(entry, "14")["identical"] is True and compare_of(entry, "10")["identical"] is True
    assert record_of(entry, "7")["details"]["qkv_fusion"]["calls_this_run"]["qkv"] == N_BLOCKS * 2 * STEPS
    assert record_of(entry, "7")["fingerprint"]["qkv_fusion"] == 8


def test_attention_override_really_runs(comfy_server: ComfyServer, eager_auto: dict[str, Any]) -> None:
    """SDPA math != flash (auto) bitwise on CPU; the compiled model must follow the pinned backend even
    though Dynamo's guards on transformer_options are filtered (the override's are kept)."""
    wf = optimized(attention="math")
    plain = add(wf, "SteadfastOptimizeModel", **dict(wf["13"]["inputs"], compile="off"))
    sampler = add(wf, "SteadfastSeededSampler", **dict(wf["7"]["inputs"], model=[plain, 0]))
    decoded = add(wf, "VAEDecode", samples=[sampler, 0], vae=["1", 2])
    h_plain = add(wf, "SteadfastHash", image=[decoded, 0])
    entry = run(comfy_server, wf)
    compiled_math = hash_of(entry, "11")
    assert compiled_math == hash_of(entry, h_plain)  # compiled (eager backend) == uncompiled
    assert compiled_math != hash_of(eager_auto["run1"], "11")  # math != auto
    assert "attention pytorch_sdpa:math" in text(entry, "7")
    assert "backend math" in text(entry, "13")


def test_warmup_then_generate(comfy_server: ComfyServer) -> None:
    wf = workflow("warmup_then_generate", steps=STEPS)
    wf["13"]["inputs"].update(backend="eager", attention="flash")
    comfy_server.free()
    first = run(comfy_server, wf)
    check_ui_lists(first)
    warm = text(first, "15")
    assert "warmup step at latent [1, 4, 8, 8]" in warm and "first call" in warm and "graph(s)" in warm
    rec1 = latest_record(comfy_server, "eager")
    assert rec1["graphs"] >= 1 and rec1["warm_targets"] == [[1, 4, 8, 8]]
    assert all("optimized_attention_override" in r["reason"] for r in rec1["recompiles"])  # other backends
    assert rec1["calls"] == 2 * (1 + STEPS)  # one warmup step, then the sampler's steps (cond, uncond alone)
    assert f"{rec1['graphs']} graph(s)" in warm

    # A new prompt text re-runs Warmup on the same (cached) optimized model: already warm, model not run.
    wf["2"]["inputs"]["text"] = "a harbour at night, watercolour"
    second = run(comfy_server, wf)
    assert "15" not in cached_nodes(second) and "13" in cached_nodes(second)
    assert text(second, "15").startswith("already warm for latent [1, 4, 8, 8]: nothing to do")
    rec2 = latest_record(comfy_server, "eager")
    assert rec2["created"] == rec1["created"]
    assert rec2["calls"] == rec1["calls"] + 2 * STEPS  # only the sampler called the model
    assert rec2["graphs"] == rec1["graphs"] and rec2["recompiles"] == rec1["recompiles"]

    # After /free the checkpoint is reloaded: Warmup runs its step again, but compiles nothing.
    comfy_server.free()
    third = run(comfy_server, wf)
    assert text(third, "15").startswith("warmup step at latent [1, 4, 8, 8]")
    rec3 = latest_record(comfy_server, "eager")
    assert rec3["created"] > rec2["created"] and rec3["graphs"] == 0 and rec3["recompiles"] == []
    assert hash_of(third, "11") == hash_of(second, "11")

    # Warmup does not change the result: the same graph without the Warmup node gives the same bits.
    del wf["15"]
    wf["6"]["inputs"]["model"] = ["13", 0]
    assert hash_of(run(comfy_server, wf), "11") == hash_of(third, "11")


def test_inductor_regional_is_run_to_run_identical(comfy_server: ComfyServer, eager_auto: dict[str, Any]) -> None:
    wf = optimized(backend="inductor")
    comfy_server.free()
    first = run(comfy_server, wf)
    rec1 = latest_record(comfy_server, "inductor")
    comfy_server.free()
    second = run(comfy_server, only(wf, "11"))  # the optimized branch alone: the baseline is not needed again
    rec2 = latest_record(comfy_server, "inductor")
    assert hash_of(first, "11") == hash_of(second, "11")
    assert rec1["block_count"] == N_BLOCKS and rec1["status"] == "warm" and rec1["disabled"] is False
    assert rec1["errors"] == [] and rec2["graphs"] == 0 and rec2["recompiles"] == []
    # generated kernels are not bit-equal to eager (measured, reported by Compare), but close
    lat = compare_of(first, "14")
    assert lat["identical"] is False and lat["psnr"] > 60
    assert hash_of(first, "11") != hash_of(eager_auto["run1"], "11")


# ------------------------------------------------------------------------------------------------
# LoRA: LoraLoaderModelOnly -> Optimize must keep the LoRA (fused projections read patched weights).
# ------------------------------------------------------------------------------------------------
LORA_NAME = "steadfast_test_lora_r4.safetensors"


@pytest.fixture(scope="module")
def lora(comfy_server: ComfyServer, tiny_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> int:
    path = tmp_path_factory.mktemp("lora") / LORA_NAME
    n = build_lora(tiny_ckpt, path)
    comfy_server.link_models("loras", {LORA_NAME: path})
    return n


def lora_workflow() -> dict[str, Any]:
    """ckpt -> Determinism -> LoRA -> Optimize(qkv, eager regional compile, math) -> sampler (7), plus
    LoRA-only (no Optimize) and LoRA -> Optimize(qkv only, ComfyUI attention) samplers; the baseline (6)
    has no LoRA."""
    wf = optimized(attention="math")
    lora_model = add(wf, "LoraLoaderModelOnly", model=["5", 0], lora_name=LORA_NAME, strength_model=1.0)
    wf["13"]["inputs"]["model"] = [lora_model, 0]
    fused_only = add(wf, "SteadfastOptimizeModel", **dict(wf["13"]["inputs"], attention="comfy", compile="off"))
    wf["s_fused"] = {"class_type": "SteadfastSeededSampler", "inputs": dict(wf["7"]["inputs"], model=[fused_only, 0])}
    wf["s_lora"] = {"class_type": "SteadfastSeededSampler", "inputs": dict(wf["7"]["inputs"], model=[lora_model, 0])}
    wf["c_fusion"] = {
        "class_type": "SteadfastCompare",
        "inputs": {"latent_a": ["s_fused", 0], "latent_b": ["s_lora", 0]},
    }
    wf["c_lora"] = {"class_type": "SteadfastCompare", "inputs": {"latent_a": ["s_lora", 0], "latent_b": ["6", 0]}}
    wf["c_opt"] = {"class_type": "SteadfastCompare", "inputs": {"latent_a": ["7", 0], "latent_b": ["s_lora", 0]}}
    return wf


@pytest.fixture(scope="module")
def lora_runs(comfy_server: ComfyServer, lora: int) -> dict[str, Any]:
    """/free; the full LoRA workflow; the plain model (no LoRA, seed 7) right after it (same loaded
    weights); /free; the plain model again (freshly loaded); the compiled LoRA branch alone again."""
    wf = lora_workflow()
    plain = only(workflow("determinism_check", steps=STEPS, seed=7), "11")
    out: dict[str, Any] = {"n_modules": lora, "lora_node": wf["13"]["inputs"]["model"][0]}
    comfy_server.free()
    out["full"] = run(comfy_server, wf)
    out["log"] = comfy_server.log_tail(2000)
    out["plain_after_lora"] = hash_of(run(comfy_server, plain), "11")
    comfy_server.free()
    out["plain_fresh"] = hash_of(run(comfy_server, plain), "11")
    out["compiled_again"] = run(comfy_server, only(wf, "11"))
    return out


def test_lora_then_optimize(lora_runs: dict[str, Any]) -> None:
    assert lora_runs["n_modules"] == N_BLOCKS * 2 * 3  # q, k, v of attn1 and attn2 in every block
    first = lora_runs["full"]
    check_ui_lists(first)
    log = lora_runs["log"]
    assert "lora key not loaded" not in log and "NOT LOADED" not in log  # every key mapped (comfy/lora.py)
    lora_effect = compare_of(first, "c_lora")
    assert lora_effect["identical"] is False and lora_effect["pct_values_differ"] > 50  # the LoRA acts
    # Optimize(qkv fusion only, ComfyUI attention) keeps the LoRA bit for bit: the fused weight is
    # built from the patched projections
    assert compare_of(first, "c_fusion")["identical"] is True
    fused = record_of(first, "s_fused")["details"]["qkv_fusion"]
    assert fused["calls_this_run"]["qkv"] == N_BLOCKS * 2 * STEPS and fused["calls_this_run"]["separate"] == 0
    # compiled + math attention with the LoRA: close to LoRA-only (attention rounding), far from no-LoRA
    opt = compare_of(first, "c_opt")
    assert opt["max_abs"] < 0.01 * lora_effect["max_abs"]
    assert "COMPILE FAILED" not in text(first, "7")
    # run-to-run identical across /free (checkpoint and LoRA reloaded, compiled code reused)
    again = lora_runs["compiled_again"]
    assert not {"7", "13", lora_runs["lora_node"]} & set(cached_nodes(again))
    assert hash_of(again, "11") == hash_of(first, "11")


def test_lora_does_not_leak_into_the_shared_model(lora_runs: dict[str, Any]) -> None:
    """Optimize applies the LoRA to the shared weights in place (fused q/k/v are views of them) and
    ComfyUI restores them after: the plain model must then give the bits of a freshly loaded one."""
    assert lora_runs["plain_after_lora"] == lora_runs["plain_fresh"]


def test_compare_tells_a_difference_by_design_from_a_failure(comfy_server: ComfyServer) -> None:
    """SDPA math (optimized side) vs flash (baseline, pinned by batch_invariant) differ in the last bits. With both
    run records linked (as the template does), Compare calls it expected (amber) and names the setting; without
    them it cannot tell and reports a plain difference (red)."""
    wf = optimized(attention="math", compile="off", qkv_fusion=False)
    unlinked = add(wf, "SteadfastCompare", latent_a=["6", 0], latent_b=["7", 0])
    entry = run(comfy_server, wf)
    linked = compare_of(entry, "14")
    assert not linked["identical"], "SDPA math and flash gave identical latents: nothing to classify"
    assert linked["expected_to_differ"] is True
    assert "different, as expected" in text(entry, "14") and "fingerprint.attention" in text(entry, "14")
    plain = compare_of(entry, unlinked)
    assert plain["expected_to_differ"] is False and "DIFFERENT" in text(entry, unlinked)
    # the line that decides comes first (the verdict, with the thumbnails' PSNR that decides it); the full-output
    # figures (their own PSNR) are folded under "measured on the full output (not what decides)"
    lines = text(entry, "14").splitlines()
    level = linked["verdict"]["level"]
    assert lines[0].startswith({"same_picture": "SAME PICTURE", "different_picture": "DIFFERENT PICTURE"}[level])
    assert "decided by PSNR" in lines[0] and lines[1].startswith("different, as expected"), lines
    # the deciding figures say they are the thumbnails' (float16, a few px), never to be read as the full output's
    assert "between float16 thumbnails" in lines[0] and "the thumbnails' max |delta|" in lines[0], lines
    folded = lines.index("measured on the full output (not what decides):")
    assert all(line.startswith("  ") for line in lines[folded + 1 :] if not line.startswith("run records differ")), (
        lines
    )
    assert sum("PSNR" in line for line in lines[:folded]) == 1, lines  # one PSNR above the fold: the deciding one
    # the run records' differences are folded into one line (a count and the fields' names), no raw values
    differ = [line for line in lines if line.startswith("run records differ in ")]
    assert len(differ) == 1 and "fingerprint.attention" in differ[0] and "see the two run records" in differ[0], lines
    assert not any(" -> " in line for line in lines), lines
