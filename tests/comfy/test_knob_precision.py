"""Precision and inductor presets on Optimize Model through the HTTP API: measured, recorded, no extra recompiles.

Precision (ComfyUI's ``set_model_compute_dtype`` on the clone): bf16 and fp16 vs fp32 on the tiny SD1.5 model are
measured, not assumed (not bit-equal, max |diff| finite and printed); explicit fp32 equals "model" (an fp32
checkpoint) bit for bit; the run record names the compute dtype and Compare, given both records, calls the
difference expected. Inductor preset ``diffusers-fast``: shown in the compile state and the run record, its own
compile cache directory, no recompile on a second run; preset vs default compiled is measured and printed.
Figures for the docs come from ``benchmarks/bench_knobs_precision.py`` (docs/benchmarks.md section 6).

Runs on its OWN server: Dynamo keeps compiled code per code object for the whole process, and a bf16 graph of
``BasicTransformerBlock.forward`` would show up as a recompile reason in other modules' first compiles.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfy_server import ComfyServer, PromptFailed
from recompile_workflows import build
from steadfast_workflows import add, compare_of, compile_records, record_of, run, text
from tiny_sd15 import CHECKPOINT_NAME as TINY_CKPT_NAME  # headless/ is on sys.path (tests/comfy/conftest.py)

pytestmark = pytest.mark.comfyui


@pytest.fixture(scope="module")
def server(comfyui_path: Path, tiny_ckpt: Path) -> Iterator[ComfyServer]:
    with ComfyServer({TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path) as srv:
        yield srv


def _branch(wf: dict[str, Any], name: str, **optimize: Any) -> str:
    """Add an Optimize (copy of "opt" with ``optimize``) -> Seeded Sampler (copy of "samp") branch; the sampler id."""
    wf[f"opt_{name}"] = {"class_type": "SteadfastOptimizeModel", "inputs": {**wf["opt"]["inputs"], **optimize}}
    wf[f"samp_{name}"] = {
        "class_type": "SteadfastSeededSampler",
        "inputs": {**wf["samp"]["inputs"], "model": [f"opt_{name}", 0]},
    }
    return f"samp_{name}"


def _compare(wf: dict[str, Any], a: str, b: str) -> str:
    return add(wf, "SteadfastCompare", latent_a=[a, 0], latent_b=[b, 0], run_record_a=[a, 1], run_record_b=[b, 1])


@pytest.fixture(scope="module")
def precisions(server: ComfyServer) -> dict[str, Any]:
    """One graph, compile off: "model" (fp32 checkpoint, node "samp"), explicit fp32, bf16, fp16."""
    wf = build(compile="off", steps=3)
    samplers = {p: _branch(wf, p, precision=p) for p in ("fp32", "bf16", "fp16")}
    cmp = {p: _compare(wf, "samp", s) for p, s in samplers.items()}
    entry = run(server, wf)
    return {
        "entry": entry,
        "cmp": {p: compare_of(entry, c) for p, c in cmp.items()},
        "samplers": samplers,
        "cmp_text": {p: text(entry, c) for p, c in cmp.items()},
    }


def test_explicit_fp32_equals_the_fp32_checkpoint(precisions: dict[str, Any]) -> None:
    assert precisions["cmp"]["fp32"]["identical"] is True
    record = record_of(precisions["entry"], precisions["samplers"]["fp32"])
    assert record["fingerprint"]["dtype"] == "torch.float32"
    assert "precision: fp32, compute torch.float32" in text(precisions["entry"], "opt_fp32")


@pytest.mark.parametrize("name,dtype", [("bf16", "torch.bfloat16"), ("fp16", "torch.float16")])
def test_half_precision_vs_fp32_is_measured_and_named(precisions: dict[str, Any], name: str, dtype: str) -> None:
    cmp = precisions["cmp"][name]
    print(
        f"\n{name} vs fp32 (tiny SD1.5, 3 steps, latent): identical={cmp['identical']} "
        f"max_abs={cmp['max_abs']} psnr={cmp['psnr']:.1f} dB (peak {cmp['psnr_peak']:.3g}) "
        f"pct_values_differ={cmp['pct_values_differ']}"
    )
    assert cmp["identical"] is False and math.isfinite(cmp["max_abs"]) and cmp["max_abs"] > 0
    record = record_of(precisions["entry"], precisions["samplers"][name])
    assert record["fingerprint"]["dtype"] == f"torch.float32 (compute {dtype})"
    assert cmp["expected_to_differ"] is True  # both run records linked: the precision difference is by design
    assert "fingerprint.dtype (numeric precision" in precisions["cmp_text"][name]


def test_bf16_regional_compile_second_run_zero_recompiles(server: ComfyServer) -> None:
    runs = []
    for seed in (5, 6):
        wf = build(seed=seed, attention="math")  # eager backend, regional; math: its own Dynamo cache entries
        wf["opt"]["inputs"]["precision"] = "bf16"
        entry = run(server, wf)
        runs.append(record_of(entry, "samp"))
    first, second = runs
    assert second["fingerprint"]["dtype"] == "torch.float32 (compute torch.bfloat16)"
    comp = second["fingerprint"]["compile"]
    assert comp["recompiles_this_run"] == 0 and comp["graphs_this_run"] == 0, comp["recompile_reasons_this_run"]
    assert comp["status"] == "warm" and comp["disabled"] is False
    assert first["output_sha256"] != second["output_sha256"]  # the seed acts


def test_preset_with_another_backend_is_a_clear_error(server: ComfyServer) -> None:
    wf = build(backend="eager")
    wf["opt"]["inputs"]["inductor_preset"] = "diffusers-fast"
    with pytest.raises(PromptFailed) as info:
        run(server, wf)
    assert info.value.node_id == "opt"
    assert "needs backend 'inductor', got backend 'eager'" in info.value.exception_message
    assert server.is_running()


@pytest.mark.slow
def test_inductor_preset_recorded_measured_and_no_recompile(server: ComfyServer) -> None:
    """Regional inductor compile with diffusers-fast beside a default-compiled and an eager branch (seed 1: the
    measurement), then, after /free, the preset alone at seeds 2 and 3: the second of those compiles nothing."""
    wf = build(seed=1, backend="inductor", cache="knobs")
    fast = _branch(wf, "fast", inductor_preset="diffusers-fast")
    eager = _branch(wf, "eager", compile="off")
    c_default = _compare(wf, fast, "samp")
    c_eager = _compare(wf, fast, eager)
    entry = run(server, wf, timeout=900)
    rec = record_of(entry, fast)
    assert rec["fingerprint"]["compile"]["inductor_preset"] == "diffusers-fast"
    assert "inductor_preset" not in record_of(entry, "samp")["fingerprint"]["compile"]  # default: no new field
    report = text(entry, "opt_fast")
    assert "conv_1x1_as_mm=True" in report and "inductor_preset: diffusers-fast" in report  # readable lines
    vs_default, vs_eager = compare_of(entry, c_default), compare_of(entry, c_eager)
    print(
        f"\ndiffusers-fast vs default inductor (regional, latent): identical={vs_default['identical']} "
        f"max_abs={vs_default['max_abs']} psnr={vs_default['psnr']}; "
        f"vs eager: identical={vs_eager['identical']} max_abs={vs_eager['max_abs']}"
    )
    assert vs_eager["identical"] is False and math.isfinite(vs_eager["max_abs"])  # compiled != eager, measured
    assert math.isfinite(vs_default["max_abs"])  # preset vs default: reported, not assumed either way
    assert vs_eager["expected_to_differ"] is True
    # one cache name, two key directories: the preset's manifest names its inductor options
    root = server.base_dir / "user" / "steadfast" / "compile_cache" / "knobs"
    manifests = [json.loads((d / "steadfast_cache.json").read_text()) for d in root.iterdir() if d.is_dir()]
    assert sorted(bool(m["fields"].get("inductor_options")) for m in manifests) == [False, True], manifests

    # Two Optimize nodes on one model share its one live registry record (the last one made): measure the preset
    # alone on a freshly loaded model, twice; the second run must compile nothing.
    server.free()
    comps = []
    for seed in (2, 3):
        again = build(seed=seed, backend="inductor", cache="knobs")
        again["opt"]["inputs"]["inductor_preset"] = "diffusers-fast"
        comps.append(record_of(run(server, again, timeout=900), "samp")["fingerprint"]["compile"])
    comp = comps[1]
    assert comp["inductor_preset"] == "diffusers-fast" and comp["status"] == "warm"
    assert comp["recompiles_this_run"] == 0 and comp["graphs_this_run"] == 0, comp["recompile_reasons_this_run"]
    # the registry keeps one live record per model (the last Optimize node run on it): now the preset's
    states = [r for r in compile_records(server) if (r["options"].get("options") or {}).get("conv_1x1_as_mm")]
    assert states and states[-1]["status"] == "warm" and states[-1]["disabled"] is False
    assert states[-1]["options"]["options"]["epilogue_fusion"] is False
