"""diffusers pipelines through their own nodes, over the HTTP API of a real ComfyUI server.

Load Diffusers Pipeline -> (Pipeline LoRA) -> (Pipeline Determinism Setup) -> Pipeline Optimize ->
(Pipeline Warmup) -> Pipeline Sampler -> Hash / Compare,
on the tiny random-weight SD pipeline built here (``headless/tiny_pipelines.py``) and linked into the session server's
``models/diffusers``; LoRAs are built here too and linked into ``models/loras``. Compiles use Dynamo's
``eager`` backend: recompiles are decided by Dynamo's guards, which do not depend on the backend.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from typing import Any

import pytest
from comfy_server import ComfyServer, PromptFailed, PromptRejected
from steadfast_workflows import add, cached_nodes, check_ui_lists, compare_of, hash_of, record_of, run, text, workflow

pytestmark = pytest.mark.comfyui

SD, FLUX, BROKEN = "steadfast-tiny-sd", "steadfast-tiny-flux", "steadfast-broken"
LORA_A, LORA_B = "steadfast-tiny-lora-a.safetensors", "steadfast-tiny-lora-b.safetensors"
SIZE, STEPS = 64, 2
EAGER_REGIONAL = dict(
    qkv_fusion=True,
    channels_last=False,
    attention="auto",
    compile="regional",
    backend="eager",
    mode="default",
    dynamic="auto",
    fullgraph=False,
    vae_slicing=False,
    vae_tiling=False,
)
BAD_LORA = "steadfast-bad-header.safetensors"


@pytest.fixture(scope="module")
def server(comfy_server: ComfyServer, tmp_path_factory: pytest.TempPathFactory) -> ComfyServer:
    """The session server with the tiny SD and Flux pipelines, a broken pipeline folder and two LoRAs
    (rank 4 and rank 2, different seeds) linked into its model folders. The broken folder is the SD one
    without its unet sub-folder."""
    from steadfast.headless import tiny_pipelines as tiny

    root = tmp_path_factory.mktemp("pipelines")
    sd = tiny.build_tiny_sd(root / "sd", seed=0)
    flux = tiny.build_tiny_flux(root / "flux", seed=0)
    broken = shutil.copytree(sd, root / "broken", ignore=shutil.ignore_patterns("unet"))  # unet folder lost
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(str(sd / "unet"))
    loras = {
        LORA_A: tiny.save_tiny_lora(tiny.tiny_lora_state_dict(unet, rank=4, seed=1), root / LORA_A),
        LORA_B: tiny.save_tiny_lora(tiny.tiny_lora_state_dict(unet, rank=2, seed=2), root / LORA_B),
    }
    header = json.dumps({"lora_unet_x.lora_down.weight": "not a tensor description"}).encode()
    (root / BAD_LORA).write_bytes(struct.pack("<Q", len(header)) + header)
    loras[BAD_LORA] = root / BAD_LORA
    comfy_server.link_models("diffusers", {SD: sd, FLUX: flux, BROKEN: broken})
    comfy_server.link_models("loras", loras)
    return comfy_server


def sampler(wf: dict, pipeline: list, prompt: str = "a cat", seed: int = 3, size: int = SIZE, **kw: Any) -> str:
    """Add a Pipeline Sampler and a Hash of its IMAGE; returns the sampler's id (the Hash is the next id)."""
    inputs = dict(
        pipeline=pipeline,
        prompt=prompt,
        negative_prompt="",
        seed=seed,
        steps=STEPS,
        cfg=5.0,
        width=size,
        height=size,
        batch_size=1,
    )
    inputs.update(kw)
    node = add(wf, "SteadfastPipelineSampler", **inputs)
    add(wf, "SteadfastHash", image=[node, 0])
    return node


def optimize(wf: dict, pipeline: list, **kw: Any) -> str:
    return add(wf, "SteadfastPipelineOptimize", pipeline=pipeline, **{**EAGER_REGIONAL, **kw})


def warmup(wf: dict, pipeline: list, **kw: Any) -> str:
    return add(
        wf,
        "SteadfastPipelineWarmup",
        pipeline=pipeline,
        **{**dict(width=SIZE, height=SIZE, batch_size=1, cfg=5.0), **kw},
    )


def loader(wf: dict, name: str = SD) -> str:
    return add(wf, "SteadfastLoadDiffusersPipeline", pipeline_name=name, dtype="fp32")


def after(node: str) -> str:
    """Id of the Hash node added right after sampler ``node``."""
    return str(int(node) + 1)


def test_one_node_per_job_and_model_nodes_keep_their_inputs(server: ComfyServer) -> None:
    info = server.get("/object_info")
    opt, smp, wu = info["SteadfastOptimizeModel"], info["SteadfastSeededSampler"], info["SteadfastWarmup"]
    # MODEL nodes: plain MODEL in/out (ComfyUI's type check rejects anything else), saved inputs unchanged
    for node in (opt, wu, smp, info["SteadfastDeterminismSetup"]):
        assert node["input"]["required"]["model"][0] == "MODEL"
    assert opt["output"][0] == wu["output"][0] == "MODEL"
    assert opt["input_order"]["required"] == [
        "model",
        "qkv_fusion",
        "channels_last",
        "attention",
        "compile",
        "backend",
        "mode",
        "dynamic",
        "fullgraph",
    ]
    # optional inputs only ever appended: saved workflows keep their positions
    assert opt["input_order"]["optional"] == [
        "strict_recompiles",
        "compile_cache",
        "precision",
        "inductor_preset",
        "quantize",
    ]
    assert smp["input_order"]["required"] == [
        "model",
        "seed",
        "steps",
        "cfg",
        "sampler_name",
        "scheduler",
        "positive",
        "negative",
        "latent_image",
        "denoise",
        "batch_seed_mode",
    ]
    assert "optional" not in smp["input_order"] or not smp["input_order"]["optional"]
    assert smp["output"] == ["LATENT", "STRING"]
    # pipeline nodes: DIFFUSERS_PIPELINE in, only the inputs a pipeline uses
    p_opt, p_smp = info["SteadfastPipelineOptimize"], info["SteadfastPipelineSampler"]
    assert p_opt["output"][0] == p_smp["input"]["required"]["pipeline"][0] == "DIFFUSERS_PIPELINE"
    assert "comfy" not in p_opt["input"]["required"]["attention"][1]["options"]
    assert {"vae_slicing", "vae_tiling"} <= set(p_opt["input_order"]["required"])
    assert p_smp["output"] == ["IMAGE", "STRING"]
    assert not {"sampler_name", "scheduler", "denoise", "batch_seed_mode"} & set(p_smp["input_order"]["required"])
    # the shared widgets are declared once: same options, defaults and tooltips on both Optimize nodes
    for name in ("compile", "backend", "mode", "dynamic", "fullgraph"):
        assert opt["input"]["required"][name] == p_opt["input"]["required"][name], name
    for name in ("strict_recompiles", "compile_cache"):
        assert opt["input"]["optional"][name] == p_opt["input"]["optional"][name], name
    for name in (
        "SteadfastLoadDiffusersPipeline",
        "SteadfastPipelineLoRA",
        "SteadfastPipelineOptimize",
        "SteadfastPipelineSampler",
        "SteadfastPipelineWarmup",
        "SteadfastPipelineDeterminismSetup",
    ):
        inputs = {**info[name]["input"]["required"], **info[name]["input"].get("optional", {})}
        assert all(spec[1].get("tooltip") for spec in inputs.values()), name
    names = info["SteadfastLoadDiffusersPipeline"]["input"]["required"]["pipeline_name"]
    assert {SD, FLUX, BROKEN} <= set(names[0] if isinstance(names[0], list) else names[1]["options"])


def test_output_depends_on_prompt_and_seed(server: ComfyServer) -> None:
    wf: dict = {}
    src = [loader(wf), 0]
    a3, a4, b3 = sampler(wf, src, "a cat", 3), sampler(wf, src, "a cat", 4), sampler(wf, src, "a dog", 3)
    batch = sampler(wf, src, "a cat", 3, batch_size=2)
    entry = run(server, wf)
    check_ui_lists(entry)
    hashes = {n: hash_of(entry, after(n)) for n in (a3, a4, b3, batch)}
    assert len({hashes[a3], hashes[a4], hashes[b3]}) == 3
    rec = record_of(entry, a3)
    assert rec["kind"] == "pipeline" and rec["output"] == "image"
    assert rec["output_sha256"] == hashes[a3] and rec["seeds"] == [3] and rec["output_shape"] == [1, SIZE, SIZE, 3]
    assert rec["details"]["pipeline"] == "StableDiffusionPipeline" and rec["sampler"] == "EulerDiscreteScheduler"
    assert rec["fingerprint"]["pipeline_compile"] == "off" and len(rec["details"]["fingerprint_digest"]) == 64
    assert rec["fingerprint"]["determinism"].startswith("not set")
    assert record_of(entry, batch)["seeds"] == [3, 4] and "image sha256" in text(entry, a3)


def test_same_seed_identical_after_free_and_optimized_run(server: ComfyServer) -> None:
    wf: dict = {}
    src = loader(wf)
    opt = optimize(wf, [src, 0])
    base, fast = sampler(wf, [src, 0]), sampler(wf, [opt, 0])
    cmp = add(wf, "SteadfastCompare", image_a=[base, 0], image_b=[fast, 0])
    runs = []
    for _ in range(2):
        server.free()
        runs.append(run(server, wf))
    first, second = runs
    assert cached_nodes(second) == []
    assert hash_of(first, after(fast)) == hash_of(second, after(fast))
    assert hash_of(first, after(base)) == hash_of(second, after(base))
    report = text(first, opt)
    assert "qkv_fusion: applied on unet, vae" in report and "compile: applied on unet (regional" in report
    assert "the input pipeline is unchanged" in report
    assert "compile cache: not used by backend eager" in report  # the MODEL path's cache line (core.compile.use)
    rec = record_of(first, fast)["compile"]
    assert rec["label"].startswith("StableDiffusionPipeline.unet (regional") and rec["status"] == "warm"
    assert rec["block_count"] == len(rec["blocks"]) > 0 and rec["options"]["backend"] == "eager"
    c = compare_of(first, cmp)
    print(
        f"tiny SD, qkv fusion + eager regional compile vs baseline: identical={c['identical']} "
        f"max|d|={c['max_abs']:.3g}; first run {first['seconds']:.1f} s, second {second['seconds']:.1f} s"
    )
    assert c["max_abs"] < 1e-4  # fp32 QKV fusion and Dynamo's eager backend: at most rounding


def test_optimize_never_changes_the_cached_loader_output(server: ComfyServer) -> None:
    """Optimize (with options that change the bits) runs on a copy: the cached loader output, reused by the
    next prompt, still gives the baseline bytes."""
    wf: dict = {}
    src = loader(wf)
    base = sampler(wf, [src, 0], seed=11)
    opt = optimize(wf, [src, 0], vae_tiling=True, channels_last=True, attention="math")
    fast = sampler(wf, [opt, 0], seed=11)
    server.free()
    first = run(server, wf)
    h_base, h_fast = hash_of(first, after(base)), hash_of(first, after(fast))
    assert h_base != h_fast  # channels-last / VAE tiling change the bits: a mutation would be visible
    again: dict = {src: wf[src]}
    base2 = sampler(again, [src, 0], seed=11)
    second = run(server, again)
    assert src in cached_nodes(second)  # the very pipeline object the Optimize node received
    assert hash_of(second, after(base2)) == h_base


def test_missing_and_broken_pipeline_folders_give_clear_errors(server: ComfyServer) -> None:
    wf: dict = {}
    sampler(wf, [loader(wf, "no-such-pipeline"), 0])
    with pytest.raises(PromptRejected) as rejected:
        run(server, wf)
    msg = json.dumps(rejected.value.node_errors)
    assert "'no-such-pipeline' not found in models/diffusers" in msg and SD in msg
    wf = {}
    sampler(wf, [loader(wf, BROKEN), 0])
    with pytest.raises(PromptFailed) as failed:
        run(server, wf)
    err = failed.value
    assert err.node_type == "SteadfastLoadDiffusersPipeline" and err.exception_type.endswith("PipelineLoadError")
    assert "component 'unet'" in err.exception_message and "missing or empty" in err.exception_message


def test_a_pipeline_wired_into_a_model_node_is_rejected_before_running(server: ComfyServer) -> None:
    """With one node per job ComfyUI's own type check refuses the wrong wire (no prompt scanning, no
    ExecutionBlocker): a DIFFUSERS_PIPELINE into Seeded Sampler's MODEL input fails validation."""
    wf = workflow("determinism_check", steps=1)
    smp = next(k for k, v in wf.items() if v["class_type"] == "SteadfastSeededSampler")
    wf[smp]["inputs"]["model"] = [loader(wf), 0]
    with pytest.raises(PromptRejected) as rejected:
        run(server, wf)
    errors = rejected.value.node_errors[smp]["errors"]
    assert any(e["type"] == "return_type_mismatch" and e["extra_info"]["input_name"] == "model" for e in errors)
    assert "DIFFUSERS_PIPELINE" in json.dumps(errors)


def test_a_lora_with_a_broken_header_names_the_file(server: ComfyServer) -> None:
    wf: dict = {}
    lora = add(wf, "SteadfastPipelineLoRA", pipeline=[loader(wf), 0], lora_name=BAD_LORA, max_rank=4)
    sampler(wf, [lora, 0])
    with pytest.raises(PromptFailed) as failed:
        run(server, wf)
    err = failed.value
    assert err.node_id == lora and err.exception_type.endswith("LoraLoadError"), err.exception_message
    assert BAD_LORA in err.exception_message and "not tensor descriptions" in err.exception_message


def test_pipeline_determinism_setup_applies_its_policy_for_the_run_only(server: ComfyServer) -> None:
    wf: dict = {}
    src = loader(wf)
    det = add(wf, "SteadfastPipelineDeterminismSetup", pipeline=[src, 0], strict=True, allow_tf32=False, num_threads=1)
    pinned, again, plain = sampler(wf, [det, 0]), sampler(wf, [det, 0]), sampler(wf, [src, 0])
    entry = run(server, wf)
    assert "pinned to 1" in text(entry, det)
    rec, rec_plain = record_of(entry, pinned), record_of(entry, plain)
    fp = rec["fingerprint"]
    assert fp["num_threads"] == 1 and fp["flags"]["deterministic_algorithms"] is True
    assert fp["determinism"]["applied"]["num_threads"] == 1
    assert rec_plain["fingerprint"]["determinism"].startswith("not set")  # restored after the pinned runs
    assert rec_plain["fingerprint"]["flags"]["deterministic_algorithms"] is False
    assert hash_of(entry, after(pinned)) == hash_of(entry, after(again))
    assert rec["details"]["fingerprint_digest"] != rec_plain["details"]["fingerprint_digest"]


def test_lora_hotswap_into_the_compiled_pipeline_does_not_recompile(server: ComfyServer) -> None:
    def build(lora_name: str) -> tuple[dict, dict[str, str]]:
        wf: dict = {}
        src = loader(wf)
        lora = add(wf, "SteadfastPipelineLoRA", pipeline=[src, 0], lora_name=lora_name, max_rank=4)
        opt = optimize(wf, [lora, 0], qkv_fusion=False)
        warm = warmup(wf, [opt, 0])
        fast = sampler(wf, [warm, 0])
        eager = sampler(wf, [lora, 0])  # the same LoRA, loaded directly, not compiled
        plain = sampler(wf, [src, 0])
        cmp = add(wf, "SteadfastCompare", image_a=[fast, 0], image_b=[eager, 0])
        return wf, dict(opt=opt, warm=warm, fast=fast, eager=eager, plain=plain, cmp=cmp)

    server.free()
    wf_a, ids = build(LORA_A)
    run_a = run(server, wf_a)
    rec_a = record_of(run_a, ids["fast"])
    assert "prepared for LoRA hot-swap up to rank 4" in text(run_a, ids["opt"])
    assert "warm-up generation" in text(run_a, ids["warm"]) and "loaded LoRA" in text(run_a, ids["warm"])
    wf_b, ids_b = build(LORA_B)
    assert ids_b == ids
    run_b = run(server, wf_b)
    rec_b = record_of(run_b, ids["fast"])
    opt_report, warm_report = text(run_b, ids["opt"]), text(run_b, ids["warm"])
    assert "reused the copy optimized earlier" in opt_report  # same compiled pipeline, new LoRA
    assert "already warm" in warm_report and f"{LORA_A} -> {LORA_B}" in warm_report  # hot-swapped in Warmup
    ca, cb = rec_a["compile"], rec_b["compile"]
    assert cb["created"] == ca["created"] and cb["status"] == "warm"  # one compile record, kept
    assert len(cb["recompiles"]) == len(ca["recompiles"]) and cb["graphs"] == ca["graphs"]  # 0 recompiles
    assert rec_b["recompiles_this_run"] == 0 and rec_b["details"]["lora"]["name"] == LORA_B
    h = {
        "a": hash_of(run_a, after(ids["fast"])),
        "b": hash_of(run_b, after(ids["fast"])),
        "plain": hash_of(run_b, after(ids["plain"])),
    }
    assert len(set(h.values())) == 3  # each LoRA acts, and differently
    for entry in (run_a, run_b):  # the hot-swapped compiled pipeline equals the LoRA loaded directly
        c = compare_of(entry, ids["cmp"])
        assert c["max_abs"] < 1e-4, c
    print(
        f"LoRA hot-swap: graphs {cb['graphs']}, recompiles {len(cb['recompiles'])} before and after; "
        f"compiled+swapped vs direct max|d| {compare_of(run_b, ids['cmp'])['max_abs']:.3g}; "
        f"runs {run_a['seconds']:.1f} s / {run_b['seconds']:.1f} s"
    )
    for r in cb["recompiles"]:
        print("  recompile (first run):", r["reason"][:200])


def test_warmup_sizes_then_no_recompile_in_the_sampler(server: ComfyServer) -> None:
    wf: dict = {}
    src = loader(wf)
    opt = optimize(wf, [src, 0], strict_recompiles=True, qkv_fusion=False, attention="flash")
    warm = warmup(wf, [opt, 0], sizes="32x32")
    big, small = sampler(wf, [warm, 0], size=SIZE), sampler(wf, [warm, 0], size=32)
    entry = run(server, wf)
    report = text(entry, warm)
    assert report.count("warm-up generation at") == 2 and "[1, 32, 32]" in report
    assert "strict_recompiles" in text(entry, opt)
    for node in (big, small):
        rec = record_of(entry, node)
        assert rec["recompiles_this_run"] == 0 and rec["compile"]["strict"] is True
        assert sorted(rec["compile"]["warm_targets"]) == [[1, 32, 32], [1, SIZE, SIZE]]


def test_flux_pipeline_depends_on_prompt_and_seed_and_repeats(server: ComfyServer) -> None:
    wf: dict = {}
    src = [loader(wf, FLUX), 0]
    a3, a3_again, a4, b3 = (
        sampler(wf, src, p, s, size=32) for p, s in (("a cat", 3), ("a cat", 3), ("a cat", 4), ("a dog", 3))
    )
    entry = run(server, wf)
    h = {n: hash_of(entry, after(n)) for n in (a3, a3_again, a4, b3)}
    assert h[a3] == h[a3_again] and len({h[a3], h[a4], h[b3]}) == 3
    assert record_of(entry, a3)["details"]["pipeline"] == "FluxPipeline"


def test_pipeline_template_runs_and_repeats(server: ComfyServer) -> None:
    """``example_workflows/api/pipeline_generate.json`` on the tiny SD pipeline (eager backend, small and short):
    it runs, the warm-up compiles, and a second run after ``/free`` gives the same image hash."""
    wf = workflow("pipeline_generate")
    kind = {v["class_type"]: k for k, v in wf.items()}
    wf[kind["SteadfastLoadDiffusersPipeline"]]["inputs"]["pipeline_name"] = SD
    wf[kind["SteadfastPipelineOptimize"]]["inputs"].update(compile="regional", backend="eager")  # template: off
    wf[kind["SteadfastPipelineWarmup"]]["inputs"].update(width=SIZE, height=SIZE)
    smp, hsh = kind["SteadfastPipelineSampler"], kind["SteadfastHash"]
    wf[smp]["inputs"].update(width=SIZE, height=SIZE, steps=STEPS)
    hashes = []
    for i in range(2):
        server.free()
        entry = run(server, wf)
        rec = record_of(entry, smp)
        assert rec["recompiles_this_run"] == 0 and rec["compile"]["status"] == "warm"
        assert isinstance(rec["fingerprint"]["determinism"], dict)
        hashes.append(hash_of(entry, hsh))
        assert rec["output_sha256"] == hashes[-1]
        if i == 0:
            # Pipeline Optimize reports before anything compiled: the record's state in one word, once, in Optimize
            # Model's words (the page turns that word warm once Warmup has run); no second, contradicting summary
            opt = text(entry, kind["SteadfastPipelineOptimize"])
            assert "new compile record (cold); compiles lazily on the first run or in Pipeline Warmup" in opt, opt
            assert re.findall(r"\b(cold|warm)\b", opt) == ["cold"], opt
    assert hashes[0] == hashes[1]
    assert "warm-up generation" in text(entry, kind["SteadfastPipelineWarmup"])


@pytest.mark.parametrize("optimized", [False, True])
def test_pipeline_batch_item_equals_single_run_at_seed_plus_i(server: ComfyServer, optimized: bool) -> None:
    """Under Pipeline Determinism Setup (batch_invariant on by default) image i of a batch of 2 equals the
    batch-1 image at seed + i, plain and with regional compile (eager backend)."""
    wf: dict = {}
    src = [
        add(
            wf,
            "SteadfastPipelineDeterminismSetup",
            pipeline=[loader(wf), 0],
            strict=True,
            allow_tf32=False,
            num_threads=0,
        ),
        0,
    ]
    if optimized:
        src = [optimize(wf, src), 0]
    batch = sampler(wf, src, seed=3, batch_size=2)
    items = [
        add(wf, "SteadfastHash", image=[add(wf, "ImageFromBatch", image=[batch, 0], batch_index=i, length=1), 0])
        for i in range(2)
    ]
    singles = [after(sampler(wf, src, seed=3 + i)) for i in range(2)]
    entry = run(server, wf, timeout=900)
    got = [hash_of(entry, h) for h in items]
    assert got == [hash_of(entry, h) for h in singles]
    assert got[0] != got[1], "the two images are equal: the output ignores the seed"
    assert record_of(entry, batch)["details"]["batch_invariant"].startswith("on:")
