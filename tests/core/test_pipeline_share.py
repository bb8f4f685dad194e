"""Weight-sharing pipeline copies and immutable handles (core/pipelines/share.py, handle.py).

The point: a pipeline value that a node graph cached must run exactly as before after a downstream node
optimized it or added a LoRA. Checked on the tiny SD pipeline by bytes (hashes of the generated images)
and by looking at the original modules (no fused projections, no compile wrappers, no LoRA layers,
contiguous conv weights).
"""

from __future__ import annotations

import pipeline_fixtures as tp
import pytest
import torch

from steadfast.core.compile.options import CompileOptions
from steadfast.core.pipelines import OptimizeOptions, PipelineStateError, compile_record, generate
from steadfast.core.pipelines.handle import (
    LoraSpec,
    PipelineHandle,
    lora_file_rank,
    optimized_handle,
    prepare_run,
    runtime_pipe,
)
from steadfast.core.pipelines.lora import LoraLoadError
from steadfast.core.pipelines.share import shared_tensor_count
from steadfast.core.record.compare import compare
from steadfast.core.record.hashing import hash_image
from steadfast.headless import tiny_pipelines as tiny

G = dict(steps=2, width=tp.SIZE, height=tp.SIZE)


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/fixtures/torch_fixtures.py


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory):
    return tp.tiny_dir(tmp_path_factory.mktemp("tiny"), "sd")


def _run(pipe, prompt="a cat", seed=3):
    return generate(pipe, prompt, seed=seed, **G)


def _untouched(unet: torch.nn.Module) -> None:
    for name, mod in unet.named_modules():
        assert not hasattr(mod, "to_qkv") and not getattr(mod, "fused_projections", False), name
        assert "_compiled_call_impl" not in vars(mod) or mod._compiled_call_impl is None, name
        assert not hasattr(mod, "lora_A"), name
    assert not getattr(unet, "peft_config", None)
    assert all(p.is_contiguous() for p in unet.parameters())


def test_optimized_copy_leaves_the_source_pipeline_as_it_was(sd_dir):
    base = tp.fresh(sd_dir)
    before = hash_image(_run(base))
    processors = dict(base.unet.attn_processors)
    opts = OptimizeOptions(
        qkv_fusion=True,
        channels_last=True,
        attention="math",
        vae_tiling=True,
        scope="regional",
        compile=CompileOptions(backend="eager"),
    )
    h, report, reused = optimized_handle(PipelineHandle(base, "tiny", "fp32"), opts)
    assert not reused and h.owned and h.optimized and h.pipe is not base
    assert report.applied == ["qkv_fusion", "channels_last", "attention", "vae_tiling", "compile"]
    optimized = _run(h.pipe)
    assert compile_record(h.pipe).stats.status == "warm"
    # the copy shares every weight except the conv weights channels-last rewrote
    shared, total = shared_tensor_count(base.unet, h.pipe.unet)
    n_conv = sum(1 for p in base.unet.parameters() if p.dim() == 4)
    assert shared == len(list(base.unet.parameters())) - n_conv and total > shared
    # the source: same bytes as before, and none of the changes on its modules
    assert hash_image(_run(base)) == before
    _untouched(base.unet)
    assert dict(base.unet.attn_processors) == processors and not base.vae.use_tiling
    assert compile_record(base) is None and not PipelineHandle(base, "tiny", "fp32").optimized
    # and the optimized copy really runs differently (VAE tiling at 64x64 blends 32-pixel tiles: visible)
    rep = compare(optimized, _run(base))
    print("optimized copy vs source:", rep.as_text())
    assert not rep.identical


def test_same_source_and_options_reuse_the_copy(sd_dir):
    base = tp.fresh(sd_dir)
    h0 = PipelineHandle(base, "tiny", "fp32")
    opts = OptimizeOptions(scope="regional", compile=CompileOptions(backend="eager"))
    h1, _, reused1 = optimized_handle(h0, opts)
    h2, _, reused2 = optimized_handle(h0, opts)
    h3, _, reused3 = optimized_handle(h0, OptimizeOptions(qkv_fusion=True))
    assert (reused1, reused2, reused3) == (False, True, False)
    assert h2.pipe is h1.pipe and h3.pipe is not h1.pipe
    with pytest.raises(PipelineStateError, match="already optimized"):
        optimized_handle(h1, opts)


def test_lora_is_loaded_at_run_time_into_a_copy_and_each_value_runs_with_its_own(sd_dir, tmp_path):
    base = tp.fresh(sd_dir)
    ref = _run(base)
    files = {
        r: tiny.save_tiny_lora(tp.tiny_lora(base, rank=r, seed=r), tmp_path / f"r{r}.safetensors") for r in (2, 4)
    }
    assert lora_file_rank(files[4]) == 4
    with pytest.raises(LoraLoadError, match="max_rank"):
        LoraSpec.from_file("r4", files[4], max_rank=2)
    plain = PipelineHandle(base, "tiny", "fp32")
    with_a = plain.replace(lora=LoraSpec.from_file("r2", files[2], 4))
    with_b = plain.replace(lora=LoraSpec.from_file("r4", files[4], 4))
    assert runtime_pipe(with_a) is runtime_pipe(with_b) is not base and runtime_pipe(plain) is base
    pipe, events = prepare_run(with_a)
    img_a = _run(pipe)
    assert events and events[0].startswith("loaded LoRA r2")
    pipe, events = prepare_run(with_b)  # rank 2 -> 4 on an unprepared, uncompiled copy: reloaded
    img_b = _run(pipe)
    assert events and "r2 -> r4" in events[0]
    assert compare(ref, img_a).pct_pixels_differ > 50 and compare(img_a, img_b).pct_pixels_differ > 50
    # the source never got LoRA layers and still gives the reference bytes
    _untouched(base.unet)
    assert hash_image(_run(base)) == hash_image(ref)
    # an optimized copy without LoRA that had one loaded by another value runs LoRA-free (disabled)
    opts = OptimizeOptions(attention="math")
    ha, _, _ = optimized_handle(with_a, opts)
    h_plain, _, reused = optimized_handle(plain, opts)
    assert h_plain.pipe is not ha.pipe and not reused  # max_rank is part of the memo key
    pipe, _ = prepare_run(ha)
    img_ha = _run(pipe)
    assert compare(img_ha, _run(h_plain.pipe)).pct_pixels_differ > 50
    ha_off = ha.replace(lora=None)
    pipe, events = prepare_run(ha_off)
    assert events and "disabled" in events[0]
    assert hash_image(_run(pipe)) == hash_image(_run(h_plain.pipe))
    pipe, events = prepare_run(ha)
    assert events == ["LoRA r2 enabled again"]
    assert hash_image(_run(pipe)) == hash_image(img_ha)


def test_qkv_fusion_with_a_lora_is_refused(sd_dir, tmp_path):
    base = tp.fresh(sd_dir)
    f = tiny.save_tiny_lora(tp.tiny_lora(base, rank=2, seed=0), tmp_path / "a.safetensors")
    h = PipelineHandle(base, "tiny", "fp32", lora=LoraSpec.from_file("a", f, 2))
    with pytest.raises(PipelineStateError, match="QKV fusion cannot be combined"):
        optimized_handle(h, OptimizeOptions(qkv_fusion=True))
