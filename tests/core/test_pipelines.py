"""Tests for core/pipelines: loading errors, reproducible generation, ordered optimizations, LoRA hot-swap.

Everything runs on tiny random-weight pipelines built at test time (tests/fixtures/pipeline_fixtures.py). The one
compiled test uses Dynamo's ``eager`` backend: recompiles are decided by Dynamo's guards, which do not
depend on the backend, so "0 recompiles after a hot-swap" is backend-independent.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pipeline_fixtures as tp
import pytest
import torch

from steadfast.core.compile.blocks import repeated_block_paths
from steadfast.core.compile.options import CompileOptions
from steadfast.core.compile.registry import REGISTRY
from steadfast.core.compile.use import CacheChoice
from steadfast.core.determinism.policy import DeterminismPolicy
from steadfast.core.determinism.torch_state import snapshot_state
from steadfast.core.optimize.plan import StepReport
from steadfast.core.pipelines import (
    LoraLoadError,
    OptimizeOptions,
    PipelineLoadError,
    PipelineStateError,
    UnsupportedAttentionError,
    compile_record,
    generate,
    load_lora,
    load_pipeline,
    optimize_pipeline,
    pipeline_report,
    prepare_lora_hotswap,
    warmup,
)
from steadfast.core.pipelines.state import peek_state
from steadfast.core.record.compare import compare
from steadfast.core.record.hashing import hash_image

G = dict(steps=tp.STEPS, width=tp.SIZE, height=tp.SIZE)


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/fixtures/torch_fixtures.py


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="module")
def sd_dir(root):
    return tp.tiny_dir(root, "sd")


@pytest.fixture(scope="module")
def flux_dir(root):
    return tp.tiny_dir(root, "flux")


@pytest.fixture(scope="module")
def sd_ref(sd_dir):
    """Baseline pipeline and its image for ("a cat", seed 3)."""
    pipe = tp.fresh(sd_dir)
    return pipe, generate(pipe, "a cat", seed=3, **G)


# ------------------------------------------------------------------ loading


def test_load_errors_name_the_problem(tmp_path, sd_dir):
    with pytest.raises(PipelineLoadError, match="does not exist"):
        load_pipeline(tmp_path / "nope")
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(PipelineLoadError, match="is a file.*single-file"):
        load_pipeline(f)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PipelineLoadError, match="no model_index.json"):
        load_pipeline(tmp_path / "empty")
    with pytest.raises(ValueError, match="dtype"):
        load_pipeline(sd_dir, dtype="fp8")

    broken = tmp_path / "broken"
    shutil.copytree(sd_dir, broken)
    shutil.rmtree(broken / "unet")
    with pytest.raises(PipelineLoadError, match="'unet'.*missing or empty"):
        load_pipeline(broken)

    corrupt = tmp_path / "corrupt"
    shutil.copytree(sd_dir, corrupt)
    for w in (corrupt / "vae").glob("*.safetensors"):
        w.write_bytes(b"not a safetensors file")
    with pytest.raises(PipelineLoadError, match="could not load StableDiffusionPipeline") as info:
        load_pipeline(corrupt)
    assert info.value.__cause__ is not None

    bad_json = tmp_path / "badjson"
    shutil.copytree(sd_dir, bad_json)
    (bad_json / "model_index.json").write_text("{not json")
    with pytest.raises(PipelineLoadError, match="not valid JSON"):
        load_pipeline(bad_json)


# ------------------------------------------------------------------ generation


def test_output_depends_on_prompt_and_seed_and_repeats(sd_dir, sd_ref):
    pipe, ref = sd_ref
    assert ref.shape == (1, tp.SIZE, tp.SIZE, 3) and ref.dtype == torch.float32
    assert 0.0 <= float(ref.min()) and float(ref.max()) <= 1.0 and float(ref.std()) > 0.05
    again = generate(pipe, "a cat", seed=3, **G)
    assert hash_image(again, raw=True) == hash_image(ref, raw=True)
    other_seed = generate(pipe, "a cat", seed=4, **G)
    other_prompt = generate(pipe, "a dog", seed=3, **G)
    digests = {hash_image(x, raw=True) for x in (ref, other_seed, other_prompt)}
    assert len(digests) == 3
    assert compare(ref, other_seed).pct_pixels_differ > 50
    assert compare(ref, other_prompt).pct_pixels_differ > 50
    # a second, freshly loaded pipeline gives the same bytes
    assert hash_image(generate(tp.fresh(sd_dir), "a cat", seed=3, **G), raw=True) == hash_image(ref, raw=True)
    as_np = generate(pipe, "a cat", seed=3, output_type="np", **G)
    assert isinstance(as_np, np.ndarray) and as_np.dtype == np.float32
    assert np.array_equal(as_np, ref.numpy())


def test_batch_item_i_is_the_batch1_image_at_seed_plus_i(sd_ref):
    pipe, _ = sd_ref
    singles = [generate(pipe, "a cat", seed=10 + i, **G) for i in range(3)]
    seq = generate(pipe, "a cat", seed=10, batch=3, batch_mode="sequential", **G)
    for i in range(3):
        assert torch.equal(seq[i : i + 1], singles[i])
    batched = generate(pipe, "a cat", seed=10, batch=3, **G)
    assert batched.shape == (3, tp.SIZE, tp.SIZE, 3)
    for i in range(3):
        rep = compare(singles[i], batched[i : i + 1])
        # same per-image noise; only CPU kernels' batch-size dependence remains (measured, not assumed)
        print(f"batched item {i} vs batch-1 seed {10 + i}: {rep.as_text()}")
        assert rep.max_abs < 1e-3
    assert compare(batched[0:1], batched[1:2]).pct_pixels_differ > 50


def test_generate_argument_errors(sd_ref):
    pipe, _ = sd_ref
    with pytest.raises(ValueError, match="output_type"):
        generate(pipe, "x", output_type="pil", **G)
    with pytest.raises(ValueError, match="batch"):
        generate(pipe, "x", batch=0, **G)
    with pytest.raises(ValueError, match="seed must be in"):
        generate(pipe, "x", seed=-1, **G)
    with pytest.raises(ValueError, match="takes no"):
        generate(pipe, "x", extra={"no_such_argument": 1}, **G)


def test_generate_under_policy_restores_global_state(sd_ref):
    pipe, ref = sd_ref
    before = snapshot_state()
    img = generate(pipe, "a cat", seed=3, policy=DeterminismPolicy(strict=True), **G)
    assert snapshot_state() == before
    rep = compare(ref, img)
    print("deterministic-algorithms policy vs default:", rep.as_text())
    assert hash_image(img, raw=True) == hash_image(
        generate(pipe, "a cat", seed=3, policy=DeterminismPolicy(strict=True), **G), raw=True
    )


# ------------------------------------------------------------------ optimizations


def test_optimize_applies_in_order_and_reports(sd_dir, sd_ref):
    _, ref = sd_ref
    pipe = tp.fresh(sd_dir)
    opts = OptimizeOptions(qkv_fusion=True, channels_last=True, attention="math", vae_slicing=True, vae_tiling=True)
    report = optimize_pipeline(pipe, opts)
    assert report.applied == ["qkv_fusion", "channels_last", "attention", "vae_slicing", "vae_tiling"]
    qkv = report.step("qkv_fusion")
    assert qkv.modules == ["unet", "vae"]
    for name, c in qkv.details["components"].items():
        assert c["params_after"] > c["params_before"]  # diffusers keeps to_q/to_k/to_v
        assert c["growth_pct"] == pytest.approx(100 * (c["params_after"] - c["params_before"]) / c["params_before"])
        assert report.params_after[name] == c["params_after"]
    assert all(
        hasattr(m, "to_qkv") or hasattr(m, "to_kv")
        for n, m in pipe.unet.named_modules()
        if n.endswith("attn1") or n.endswith("attn2")
    )
    assert report.step("channels_last").details["converted"]["unet"] > 0
    assert pipe.unet.conv_in.weight.is_contiguous(memory_format=torch.channels_last)
    att = report.step("attention")
    assert att.details["sdpa_context"] == "math" and att.details["diffusers_backend"] is None  # UNet: direct SDPA
    assert pipe.vae.use_slicing and pipe.vae.use_tiling
    text = report.as_text()
    assert "qkv_fusion: applied on unet, vae" in text and "%" in text
    json.dumps(report.as_dict())
    img = generate(pipe, "a cat", seed=3, **G)
    assert not compare(ref, img).identical  # channels_last / math SDPA / tiling change bits (measured)
    with pytest.raises(PipelineStateError, match="already optimized"):
        optimize_pipeline(pipe, OptimizeOptions())


def test_qkv_fusion_alone_is_bit_equal_in_fp32_on_cpu(sd_dir, sd_ref):
    _, ref = sd_ref
    pipe = tp.fresh(sd_dir)
    optimize_pipeline(pipe, OptimizeOptions(qkv_fusion=True))
    rep = compare(ref, generate(pipe, "a cat", seed=3, **G))
    print("qkv fusion vs baseline:", rep.as_text())
    assert rep.identical


def test_attention_backend_errors_before_any_change(sd_dir):
    pipe = tp.fresh(sd_dir)
    for name, pattern in (
        ("efficient", "does not run"),
        ("flex", "call torch SDPA directly"),
        ("no-such-backend", "unknown attention backend"),
    ):
        with pytest.raises(UnsupportedAttentionError, match=pattern):
            optimize_pipeline(pipe, OptimizeOptions(qkv_fusion=True, attention=name))
    assert not hasattr(pipe.unet.down_blocks[1].attentions[0].transformer_blocks[0].attn1, "to_qkv")
    optimize_pipeline(pipe, OptimizeOptions())  # still optimizable: nothing was recorded


def test_model_only_steps_are_refused_before_any_change(sd_dir):
    """One plan type for both paths: a pipeline refuses the MODEL path's own steps up front, nothing recorded."""
    pipe = tp.fresh(sd_dir)
    for kw, words in (({"precision": "bf16"}, "precision=bf16"), ({"quantize": "int8"}, "quantize=int8")):
        with pytest.raises(ValueError, match=f"{words}: Optimize Model"):
            optimize_pipeline(pipe, OptimizeOptions(qkv_fusion=True, **kw))
    assert not hasattr(pipe.unet.down_blocks[1].attentions[0].transformer_blocks[0].attn1, "to_qkv")
    rep = optimize_pipeline(pipe, OptimizeOptions(qkv_fusion=True))  # still optimizable: nothing was recorded
    assert [s.step for s in rep.steps] == ["qkv_fusion"] and all(isinstance(s, StepReport) for s in rep.steps)


def test_flux_uses_diffusers_dispatcher_and_keeps_global_backend(flux_dir):
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    before = _AttentionBackendRegistry.get_active_backend()[0]
    pipe = tp.fresh(flux_dir)
    base = generate(pipe, "a cat", seed=1, **G)
    assert compare(base, generate(pipe, "a fox", seed=1, **G)).pct_pixels_differ > 50
    assert compare(base, generate(pipe, "a cat", seed=2, **G)).pct_pixels_differ > 50
    opt = tp.fresh(flux_dir)
    rep = optimize_pipeline(
        opt,
        OptimizeOptions(qkv_fusion=True, attention="math", scope="regional", compile=CompileOptions(backend="eager")),
    )
    att = rep.step("attention")
    assert att.details["diffusers_backend"] == "_native_math" and att.details["dispatch_modules"] == 4
    assert _AttentionBackendRegistry.get_active_backend()[0] == before
    growth = rep.step("qkv_fusion").details["components"]["transformer"]["growth_pct"]
    print(f"diffusers fuse_qkv_projections parameter growth, tiny Flux: {growth:.1f} %")
    assert growth > 5  # diffusers keeps to_q/k/v and adds to_qkv
    comp = rep.step("compile")
    assert comp.details["kind"] == "regional"
    assert comp.details["block_classes"] == {"FluxTransformerBlock": 2, "FluxSingleTransformerBlock": 2}
    assert repeated_block_paths(opt.transformer) == comp.details["blocks"]


def test_regional_falls_back_to_full_without_repeated_blocks(sd_dir):
    pipe = tp.fresh(sd_dir)
    pipe.unet._repeated_blocks = []  # instance-level, like SD3 / VAEs which declare none
    rep = optimize_pipeline(pipe, OptimizeOptions(scope="regional", compile=CompileOptions(backend="eager")))
    comp = rep.step("compile")
    assert comp.details["kind"] == "full" and "declares no _repeated_blocks" in comp.note
    assert compile_record(pipe) is REGISTRY.get(pipe.unet)


# ------------------------------------------------------------------ LoRA


def test_qkv_fusion_and_lora_are_refused_together(sd_dir):
    pipe = tp.fresh(sd_dir)
    optimize_pipeline(pipe, OptimizeOptions(qkv_fusion=True))
    with pytest.raises(LoraLoadError, match="fused"):
        load_lora(pipe, tp.tiny_lora(pipe, 4, 0), "a")
    pipe2 = tp.fresh(sd_dir)
    load_lora(pipe2, tp.tiny_lora(pipe2, 4, 0), "a")
    with pytest.raises(PipelineStateError, match="LoRA"):
        optimize_pipeline(pipe2, OptimizeOptions(qkv_fusion=True))
    with pytest.raises(LoraLoadError, match="already loaded"):
        load_lora(pipe2, tp.tiny_lora(pipe2, 4, 1), "a")
    with pytest.raises(LoraLoadError, match="no adapter named 'b'"):
        load_lora(pipe2, tp.tiny_lora(pipe2, 4, 1), "b", hotswap=True)
    with pytest.raises(LoraLoadError, match="does not exist"):
        load_lora(pipe2, "/no/such/lora.safetensors", "c")


def test_lora_hotswap_into_compiled_unet_does_not_recompile(sd_dir, tmp_path):
    ref_pipe = tp.fresh(sd_dir)
    lora_a = tp.tiny_lora(ref_pipe, rank=4, seed=1)
    lora_b = tp.tiny_lora(ref_pipe, rank=8, seed=2)  # different rank: padded to target_rank
    base = generate(ref_pipe, "a cat", seed=5, **G)
    load_lora(ref_pipe, lora_b, "style")
    ref_b = generate(ref_pipe, "a cat", seed=5, **G)  # eager, B loaded directly

    pipe = tp.fresh(sd_dir)
    prepare_lora_hotswap(pipe, target_rank=8)
    file_a = tp.tiny.save_tiny_lora(lora_a, tmp_path / "a.safetensors")
    first = load_lora(pipe, file_a, "style")
    assert first.components == ["unet"] and not first.compiled
    optimize_pipeline(pipe, OptimizeOptions(scope="regional", compile=CompileOptions(backend="eager")))
    with pytest.raises(PipelineStateError):
        prepare_lora_hotswap(pipe, 8)
    w = warmup(pipe, tp.SIZE, tp.SIZE, steps=tp.STEPS)
    rec = compile_record(pipe)
    assert w.compiled and rec.stats.status == "warm" and rec.stats.graphs >= 1 and len(rec.blocks) == 8
    img_a = generate(pipe, "a cat", seed=5, **G)
    assert compare(base, img_a).pct_pixels_differ > 50  # the LoRA acts
    graphs, recompiles = rec.stats.graphs, len(rec.stats.recompiles)

    swap = load_lora(pipe, lora_b, "style", hotswap=True)
    assert swap.hotswap and swap.compiled and swap.note == ""
    img_b = generate(pipe, "a cat", seed=5, **G)
    assert len(rec.stats.recompiles) == recompiles and rec.stats.graphs == graphs  # no recompile, no new graph
    assert compare(img_a, img_b).pct_pixels_differ > 50  # B is active
    rep = compare(ref_b, img_b)
    print("hot-swapped B (compiled, eager backend) vs B loaded directly (eager):", rep.as_text())
    assert rep.max_abs < 1e-4
    report = pipeline_report(pipe)
    assert report["lora"]["adapters"] == ["style"] and len(report["lora"]["events"]) == 2
    assert report["compile"]["status"] == "warm"
    json.dumps(report)


def test_pipeline_report_is_json_and_fingerprinted(sd_ref):
    pipe, _ = sd_ref
    rep = pipeline_report(pipe)
    assert rep["pipeline"] == "StableDiffusionPipeline" and rep["denoiser"] == "unet"
    assert rep["components"]["unet"]["params"] > 0 and rep["optimize"] is None and rep["compile"] is None
    assert len(rep["fingerprint_digest"]) == 64
    json.dumps(rep)


@pytest.mark.slow
def test_lora_hotswap_with_inductor_does_not_recompile(sd_dir):
    """The same hot-swap with the real inductor backend (C++ codegen; about a minute on 2 cores)."""
    ref_pipe = tp.fresh(sd_dir)
    lora_a, lora_b = tp.tiny_lora(ref_pipe, rank=4, seed=1), tp.tiny_lora(ref_pipe, rank=8, seed=2)
    load_lora(ref_pipe, lora_b, "style")
    ref_b = generate(ref_pipe, "a cat", seed=5, **G)
    pipe = tp.fresh(sd_dir)
    prepare_lora_hotswap(pipe, target_rank=8)
    load_lora(pipe, lora_a, "style")
    optimize_pipeline(pipe, OptimizeOptions(scope="regional", compile=CompileOptions(backend="inductor")))
    w = warmup(pipe, tp.SIZE, tp.SIZE, steps=tp.STEPS)
    rec = compile_record(pipe)
    print(f"inductor warm-up {w.seconds:.1f} s: {rec.as_text()}")
    img_a = generate(pipe, "a cat", seed=5, **G)
    graphs, recompiles = rec.stats.graphs, len(rec.stats.recompiles)
    load_lora(pipe, lora_b, "style", hotswap=True)
    img_b = generate(pipe, "a cat", seed=5, **G)
    assert len(rec.stats.recompiles) == recompiles and rec.stats.graphs == graphs
    assert compare(img_a, img_b).pct_pixels_differ > 50
    rep = compare(ref_b, img_b)
    print("hot-swapped B (inductor) vs B eager:", rep.as_text())
    assert rep.max_abs < 1e-3  # compiled != eager bitwise is expected; it must still be the same image


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_dynamo")
def test_pipeline_compile_uses_the_persistent_compile_cache(sd_dir, sd_ref, tmp_path):
    """Pipeline Optimize's compile goes through ``core.compile.use.compile_use`` as Optimize Model's does: the named
    cache under the operator's root is active around each run (``Compiled.run``), inductor's files land there and
    are recorded, the record names the cache, and the image is the uncompiled one to compile's rounding. Without a
    cache choice nothing is written there (inductor about a minute on 2 cores)."""
    opts = OptimizeOptions(scope="regional", compile=CompileOptions(backend="inductor"))
    bare = tp.fresh(sd_dir)
    optimize_pipeline(bare, opts)
    assert peek_state(bare).compiled.cache is None and not any(tmp_path.iterdir())
    pipe = tp.fresh(sd_dir)
    choice = CacheChoice(name="pipes", root=tmp_path, source="test", device="cpu")
    rep = optimize_pipeline(pipe, opts, cache=choice)
    compiled = peek_state(pipe).compiled
    assert compiled.cache is not None and compiled.lines[0] == "compile cache: 'pipes' (test)", compiled.lines
    assert compiled.cache.recorded() == {}  # opened, nothing compiled yet
    image = generate(pipe, "a cat", seed=3, **G)
    recorded = compiled.cache.recorded()
    assert any(name.endswith(".py") for name in recorded), sorted(recorded)[:10]  # inductor's generated code
    assert compiled.cache.path.is_relative_to(tmp_path / "pipes")
    assert compile_record(pipe).stats.compile_cache["name"] == "pipes" and rep.steps[-1].step == "compile"
    assert compare(sd_ref[1], image).max_abs < 1e-3  # compiled != eager bitwise is expected; the same image
    assert compare(sd_ref[1], generate(pipe, "a cat", seed=4, **G)).max_abs > 1e-2  # the image depends on the seed


@pytest.mark.usefixtures("fresh_dynamo")  # compiled code from earlier tests' pipelines (other requires_grad) aside
def test_warmup_does_not_recompile_on_strided_block_inputs(sd_dir, sd_ref):
    """SD's transformer blocks get ``hidden_states`` as a permuted view; at the lowest resolution (one latent
    pixel) its size-1 dimension has another stride than at the others, and Dynamo guards on every stride: the
    warm-up recompiled ("stride mismatch at index 1"). The blocks' compiled call now gets contiguous inputs, so
    the warm-up compiles one graph and the image is the same bits as without the fix's copies (eager backend)."""
    pipe = tp.fresh(sd_dir)
    rep = optimize_pipeline(
        pipe, OptimizeOptions(qkv_fusion=False, scope="regional", compile=CompileOptions(backend="eager"))
    )
    assert not [s.note for s in rep.steps if s.step == "compile" and "contiguous" in s.note]
    w = warmup(pipe, tp.SIZE, tp.SIZE, guidance=7.0)
    rec = compile_record(pipe)
    assert w.recompiles == 0 and rec.stats.recompiles == [], [r["reason"] for r in rec.stats.recompiles]
    image = generate(pipe, "a cat", seed=3, **G)
    assert rec.stats.recompiles == [] and rec.stats.graphs == w.graphs
    assert compare(sd_ref[1], image).max_abs < 1e-4
