"""diffusers pipelines through the same nodes, over the HTTP API of a real ComfyUI server.

Load Diffusers Pipeline -> (Pipeline LoRA) -> Optimize Model -> (Warmup) -> Seeded Sampler -> Hash / Compare,
on the tiny random-weight SD pipeline built here (``core/tiny.py``) and linked into the session server's
``models/diffusers``; LoRAs are built here too and linked into ``models/loras``. Compiles use Dynamo's
``eager`` backend: recompiles are decided by Dynamo's guards, which do not depend on the backend.
"""
from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from comfy_server import ComfyServer, PromptFailed, PromptRejected
from steadfast_workflows import add, cached_nodes, check_ui_lists, compare_of, hash_of, record_of, run, text, workflow

pytestmark = pytest.mark.comfyui

SD, FLUX, BROKEN = "steadfast-tiny-sd", "steadfast-tiny-flux", "steadfast-broken"
LORA_A, LORA_B = "steadfast-tiny-lora-a.safetensors", "steadfast-tiny-lora-b.safetensors"
SIZE, STEPS = 64, 2
EAGER_REGIONAL = dict(qkv_fusion=True, channels_last=False, attention="auto", compile="regional",
                      backend="eager", mode="default", dynamic="auto", fullgraph=False)


@pytest.fixture(scope="module")
def server(comfy_server: ComfyServer, tmp_path_factory: pytest.TempPathFactory) -> ComfyServer:
    """The session server with the tiny SD and Flux pipelines, a broken pipeline folder and two LoRAs
    (rank 4 and rank 2, different seeds) linked into its model folders. The broken folder is the SD one
    without its unet sub-folder."""
    from steadfast.core import tiny

    root = tmp_path_factory.mktemp("pipelines")
    sd = tiny.build_tiny_sd(root / "sd", seed=0)
    flux = tiny.build_tiny_flux(root / "flux", seed=0)
    broken = shutil.copytree(sd, root / "broken", ignore=shutil.ignore_patterns("unet"))  # unet folder lost
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(str(sd / "unet"))
    loras = {LORA_A: tiny.save_tiny_lora(tiny.tiny_lora_state_dict(unet, rank=4, seed=1), root / LORA_A),
             LORA_B: tiny.save_tiny_lora(tiny.tiny_lora_state_dict(unet, rank=2, seed=2), root / LORA_B)}
    comfy_server.link_models("diffusers", {SD: sd, FLUX: flux, BROKEN: broken})
    comfy_server.link_models("loras", loras)
    return comfy_server


def sampler(wf: dict, model: list, prompt: str = "a cat", seed: int = 3, size: int = SIZE, **kw: Any) -> str:
    """Add a Seeded Sampler on a pipeline (required MODEL-path widgets at their defaults) and a Hash of its IMAGE;
    returns the sampler's id (the Hash is the next id)."""
    inputs = dict(model=model, seed=seed, steps=STEPS, cfg=5.0, sampler_name="euler", scheduler="normal",
                  denoise=1.0, batch_seed_mode="incremental", prompt=prompt, negative_prompt="", width=size,
                  height=size, batch_size=1)
    inputs.update(kw)
    node = add(wf, "SteadfastSeededSampler", **inputs)
    add(wf, "SteadfastHash", image=[node, 2])
    return node


def loader(wf: dict, name: str = SD) -> str:
    return add(wf, "SteadfastLoadDiffusersPipeline", pipeline_name=name, dtype="fp32")


def after(node: str) -> str:
    """Id of the Hash node added right after sampler ``node``."""
    return str(int(node) + 1)


def test_schema_accepts_pipelines_and_keeps_the_old_inputs(server: ComfyServer) -> None:
    info = server.get("/object_info")
    opt, smp, wu = info["SteadfastOptimizeModel"], info["SteadfastSeededSampler"], info["SteadfastWarmup"]
    for node in (opt, wu):  # MODEL or pipeline in, the same type out
        spec = node["input"]["required"]["model"]
        assert spec[0] == "COMFY_MATCHTYPE_V3" and spec[1]["template"]["allowed_types"] == "MODEL,DIFFUSERS_PIPELINE"
        assert node["output_matchtypes"][0] == spec[1]["template"]["template_id"]
    # saved workflows: the old inputs keep their names and relative order; new ones are optional, at the end
    assert opt["input_order"]["required"] == ["model", "qkv_fusion", "channels_last", "attention", "compile",
                                              "backend", "mode", "dynamic", "fullgraph"]
    assert {"vae_slicing", "vae_tiling"} <= set(opt["input_order"]["optional"])
    assert smp["input"]["required"]["model"][0] == "MODEL,DIFFUSERS_PIPELINE"
    assert smp["input_order"]["required"] == ["model", "seed", "steps", "cfg", "sampler_name", "scheduler",
                                              "denoise", "batch_seed_mode"]
    assert smp["input_order"]["optional"][:3] == ["positive", "negative", "latent_image"]
    assert smp["output"] == ["LATENT", "STRING", "IMAGE"]
    for name in ("SteadfastLoadDiffusersPipeline", "SteadfastPipelineLoRA"):
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
    assert rec["image_sha256"] == hashes[a3] and rec["seeds"] == [3] and rec["image_shape"] == [1, SIZE, SIZE, 3]
    assert rec["pipeline"] == "StableDiffusionPipeline" and rec["scheduler"] == "EulerDiscreteScheduler"
    assert rec["fingerprint"]["pipeline_compile"] == "off" and len(rec["fingerprint_digest"]) == 64
    assert record_of(entry, batch)["seeds"] == [3, 4] and "image sha256" in text(entry, a3)


def test_same_seed_identical_after_free_and_optimized_run(server: ComfyServer) -> None:
    wf: dict = {}
    src = loader(wf)
    opt = add(wf, "SteadfastOptimizeModel", model=[src, 0], **EAGER_REGIONAL)
    base, fast = sampler(wf, [src, 0]), sampler(wf, [opt, 0])
    cmp = add(wf, "SteadfastCompare", image_a=[base, 2], image_b=[fast, 2])
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
    rec = record_of(first, fast)["compile"]
    assert rec["label"].startswith("StableDiffusionPipeline.unet (regional") and rec["status"] == "warm"
    assert rec["block_count"] == len(rec["blocks"]) > 0 and rec["options"]["backend"] == "eager"
    c = compare_of(first, cmp)
    print(f"tiny SD, qkv fusion + eager regional compile vs baseline: identical={c['identical']} "
          f"max|d|={c['max_abs']:.3g}; first run {first['seconds']:.1f} s, second {second['seconds']:.1f} s")
    assert c["max_abs"] < 1e-4  # fp32 QKV fusion and Dynamo's eager backend: at most rounding


def test_optimize_never_changes_the_cached_loader_output(server: ComfyServer) -> None:
    """Optimize (with options that change the bits) runs on a copy: the cached loader output, reused by the
    next prompt, still gives the baseline bytes."""
    wf: dict = {}
    src = loader(wf)
    base = sampler(wf, [src, 0], seed=11)
    opt = add(wf, "SteadfastOptimizeModel", model=[src, 0], vae_tiling=True,
              **{**EAGER_REGIONAL, "channels_last": True, "attention": "math"})
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


def test_wiring_the_output_the_input_cannot_produce_fails_loudly(server: ComfyServer) -> None:
    """MODEL -> IMAGE output, or pipeline -> LATENT output, connected: the prompt fails at the sampler (an
    ExecutionBlocker alone would silently skip e.g. a Hash check in a headless run)."""
    wf = workflow("determinism_check", steps=1)
    smp = next(k for k, v in wf.items() if v["class_type"] == "SteadfastSeededSampler")
    add(wf, "SteadfastHash", image=[smp, 2])
    with pytest.raises(PromptFailed) as failed:
        run(server, wf)
    assert failed.value.node_id == smp and "IMAGE is only produced for a DIFFUSERS_PIPELINE" in \
        failed.value.exception_message
    wf = {}
    smp = sampler(wf, [loader(wf), 0])
    add(wf, "SteadfastHash", latent=[smp, 0])
    with pytest.raises(PromptFailed) as failed:
        run(server, wf)
    assert failed.value.node_id == smp and "LATENT is only produced when sampling a MODEL" in \
        failed.value.exception_message


def test_lora_hotswap_into_the_compiled_pipeline_does_not_recompile(server: ComfyServer) -> None:
    def build(lora_name: str) -> tuple[dict, dict[str, str]]:
        wf: dict = {}
        src = loader(wf)
        lora = add(wf, "SteadfastPipelineLoRA", pipeline=[src, 0], lora_name=lora_name, max_rank=4)
        opt = add(wf, "SteadfastOptimizeModel", model=[lora, 0], **{**EAGER_REGIONAL, "qkv_fusion": False})
        warm = add(wf, "SteadfastWarmup", model=[opt, 0], width=SIZE, height=SIZE, batch_size=1, cfg=5.0)
        fast = sampler(wf, [warm, 0])
        eager = sampler(wf, [lora, 0])  # the same LoRA, loaded directly, not compiled
        plain = sampler(wf, [src, 0])
        cmp = add(wf, "SteadfastCompare", image_a=[fast, 2], image_b=[eager, 2])
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
    assert rec_b["recompiles_this_run"] == 0 and rec_b["lora"]["name"] == LORA_B
    h = {"a": hash_of(run_a, after(ids["fast"])), "b": hash_of(run_b, after(ids["fast"])),
         "plain": hash_of(run_b, after(ids["plain"]))}
    assert len(set(h.values())) == 3  # each LoRA acts, and differently
    for entry in (run_a, run_b):  # the hot-swapped compiled pipeline equals the LoRA loaded directly
        c = compare_of(entry, ids["cmp"])
        assert c["max_abs"] < 1e-4, c
    print(f"LoRA hot-swap: graphs {cb['graphs']}, recompiles {len(cb['recompiles'])} before and after; "
          f"compiled+swapped vs direct max|d| {compare_of(run_b, ids['cmp'])['max_abs']:.3g}; "
          f"runs {run_a['seconds']:.1f} s / {run_b['seconds']:.1f} s")
    for r in cb["recompiles"]:
        print("  recompile (first run):", r["reason"][:200])


def test_warmup_sizes_then_no_recompile_in_the_sampler(server: ComfyServer) -> None:
    wf: dict = {}
    src = loader(wf)
    opt = add(wf, "SteadfastOptimizeModel", model=[src, 0], strict_recompiles=True,
              **{**EAGER_REGIONAL, "qkv_fusion": False, "attention": "flash"})
    warm = add(wf, "SteadfastWarmup", model=[opt, 0], width=SIZE, height=SIZE, batch_size=1, cfg=5.0, sizes="32x32")
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
    a3, a3_again, a4, b3 = (sampler(wf, src, p, s, size=32) for p, s in
                            (("a cat", 3), ("a cat", 3), ("a cat", 4), ("a dog", 3)))
    entry = run(server, wf)
    h = {n: hash_of(entry, after(n)) for n in (a3, a3_again, a4, b3)}
    assert h[a3] == h[a3_again] and len({h[a3], h[a4], h[b3]}) == 3
    assert record_of(entry, a3)["pipeline"] == "FluxPipeline"
