"""Optimize Model's ``quantize`` (torchao dynamic quantization) over the HTTP API of a real ComfyUI server.

One fresh server for this module (recompile counts here cannot come from another module), with the tiny
SD1.5-architecture checkpoint and a seeded LoRA on its to_q/to_k/to_v. Skipped when torchao is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfy_server import ComfyServer, PromptFailed
from recompile_workflows import build, server_with_lora
from steadfast_workflows import add, compare_of, record_of, run, text, workflow

from steadfast.core.record import explain

pytestmark = pytest.mark.comfyui
pytest.importorskip("torchao", reason="torchao not installed (pip install torchao): quantize cannot run")

LORA = "steadfast_quantize_lora.safetensors"
N_LINEAR = 47  # Linear layers of the tiny SD1.5 UNet that quantize picks (measured; the rest are skipped)


@pytest.fixture(scope="module")
def server(comfyui_path: Path, tiny_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComfyServer]:
    with server_with_lora(comfyui_path, tiny_ckpt, tmp_path_factory.mktemp("quantize_lora"), LORA) as srv:
        yield srv


def go(server: ComfyServer, quantize: str = "int8-dynamic", **kw: Any) -> dict[str, Any]:
    wf = build(**{"compile": "off", **kw})
    wf["opt"]["inputs"]["quantize"] = quantize
    entry = run(server, wf, timeout=900)
    record = record_of(entry, "samp")
    return {
        "entry": entry,
        "record": record,
        "compile": record["fingerprint"]["compile"],
        "hash": record["output_sha256"],
        "report": text(entry, "opt"),
    }


@pytest.fixture(scope="module")
def eager_runs(server: ComfyServer) -> dict[str, Any]:
    out = {"base": go(server, "off"), "q1": go(server)}
    server.free()  # caches dropped, model unloaded (quantized copies dropped at detach), reloaded: rebuilt
    out["q2"] = go(server)
    return out


def test_int8_differs_from_baseline_and_is_run_to_run_identical(eager_runs: dict[str, Any]) -> None:
    base, q1, q2 = eager_runs["base"], eager_runs["q1"], eager_runs["q2"]
    assert q1["hash"] != base["hash"]
    assert q1["hash"] == q2["hash"]
    assert f"quantize: int8-dynamic (torchao), {N_LINEAR} Linear layers; built at the first run" in q1["report"]


def test_run_record_names_quantize_as_expected_difference(eager_runs: dict[str, Any]) -> None:
    base, q1 = eager_runs["base"]["record"], eager_runs["q1"]["record"]
    assert "quantize" not in base["fingerprint"]  # off: the fingerprint is what it was before this input
    fq = q1["fingerprint"]["quantize"]
    assert fq["mode"] == "int8-dynamic" and fq["layers"] == N_LINEAR and fq["torchao"]
    expected, why = explain.expected_difference(base, q1)
    assert expected is True and "fingerprint.quantize." in why and "quantized" in why


def test_compare_node_says_different_as_expected(server: ComfyServer) -> None:
    wf = workflow("optimized_vs_baseline", steps=2)
    wf["13"]["inputs"].update(compile="off", qkv_fusion=True, quantize="int8-dynamic")
    entry = run(server, wf, timeout=900)
    latents = compare_of(entry, "14")
    # a seeded random-weight model at cfg 7 amplifies the int8 error (one UNet call: 2 % relative, measured)
    assert latents["identical"] is False and latents["max_abs"] > 0, latents
    assert latents["expected_to_differ"] is True, text(entry, "14")
    assert "different, as expected" in text(entry, "14") and "fingerprint.quantize" in text(entry, "14")
    # q/k/v of fused attention run in the fused matmul: not quantized, and said so
    assert "fused by qkv_fusion" in text(entry, "13")
    print(
        f"\n[quantize] tiny SD1.5, int8-dynamic vs fp32, 2 steps: latent max|d| {latents['max_abs']:.4g}, "
        f"image max|d| {compare_of(entry, '10')['max_abs']:.4g}"
    )


def test_lora_is_quantized_with_the_weights(server: ComfyServer, eager_runs: dict[str, Any]) -> None:
    """LoRA patches land on the full-precision weights before the quantized copies are built (ON_PRE_RUN).

    The quantized and the plain copy below carry the same weight patches, so ComfyUI switches between them
    without patching again: the wrapper must see what was patched through the source and the other way round."""
    wf = build(compile="off", lora=(LORA, 1.0))
    wf["opt"]["inputs"]["quantize"] = "int8-dynamic"
    plain = add(wf, "SteadfastOptimizeModel", **dict(wf["opt"]["inputs"], quantize="off"))
    samp = add(wf, "SteadfastSeededSampler", **dict(wf["samp"]["inputs"], model=[plain, 0]))
    vs_lora = add(wf, "SteadfastCompare", latent_a=["samp", 0], latent_b=[samp, 0])
    entry = run(server, wf, timeout=900)
    q_lora = record_of(entry, "samp")["output_sha256"]
    assert q_lora != eager_runs["q1"]["hash"]  # the LoRA acts on the quantized model (not lost)
    # ... and on the unquantized copy sharing the same weight patches (ComfyUI loads the two without re-patching)
    assert record_of(entry, samp)["output_sha256"] != eager_runs["base"]["hash"]
    lora_err = compare_of(entry, vs_lora)["max_abs"]
    assert lora_err > 0 and q_lora != record_of(entry, samp)["output_sha256"]
    print(f"\n[quantize] int8+LoRA vs fp32+LoRA latent max|d| {lora_err:.4g}")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_regional_compile_second_run_zero_recompiles(server: ComfyServer, backend: str) -> None:
    first = go(server, compile="regional", backend=backend, seed=7)
    second = go(server, compile="regional", backend=backend, seed=8)
    for r in (first, second):
        assert r["compile"]["disabled"] is False and r["compile"]["status"] == "warm", r["compile"]
    assert first["compile"]["graphs"] >= 1
    assert second["compile"]["recompiles_this_run"] == 0, second["compile"]["recompile_reasons_this_run"]
    assert second["compile"]["graphs"] == first["compile"]["graphs"]  # nothing compiled by the second run
    assert second["hash"] != first["hash"]  # other seed
    assert second["record"]["fingerprint"]["quantize"]["mode"] == "int8-dynamic"
    # a LoRA and a strength change on the compiled, quantized model: re-quantized, never recompiled
    loras = [go(server, compile="regional", backend=backend, seed=8, lora=(LORA, s)) for s in (1.0, 0.5)]
    for r in loras:
        assert r["compile"]["recompiles_this_run"] == 0, r["compile"]["recompile_reasons_this_run"]
    assert len({second["hash"], loras[0]["hash"], loras[1]["hash"]}) == 3
    if backend == "eager":  # Dynamo tracing only: the same ops as the uncompiled quantized model
        assert go(server, compile="regional", backend="eager", seed=42)["hash"] == go(server, seed=42)["hash"]


def test_fp8_refused_on_cpu_as_a_node_error(server: ComfyServer) -> None:
    """Refused first thing when Optimize Model runs, naming quantize (validate_inputs takes compile_cache alone, so
    that a bad compile_cache marks no other input)."""
    wf = build(compile="off")
    wf["opt"]["inputs"]["quantize"] = "fp8-dynamic"
    with pytest.raises(PromptFailed) as info:
        server.run(wf)
    assert info.value.node_id == "opt" and info.value.exception_message.startswith("quantize: ")
    detail = info.value.exception_message
    assert "fp8-dynamic needs a CUDA GPU with compute capability >= 8.9" in detail and "int8-dynamic" in detail
