"""Issue 24 on a real NVIDIA GPU: what a CPU cannot show. Every test is marked ``gpu`` (``pytest -m gpu``, run by
``benchmarks/gpu_protocol.py`` on a lent GPU) and skipped, with the reason, where CUDA is not available.

Each test names the issue item it checks. The CPU-side twins: ``tests/core/test_optimize_attention.py`` (probe,
fallback), ``tests/comfy/test_fp8_weights.py`` (fp8 + attention auto), ``tests/comfy/test_dynamic_vram.py``
(Dynamic VRAM emulated), ``tests/core/test_determinism.py`` (cuBLAS judgement, fill), ``tests/core/
test_pipeline_memory.py`` (pipelines kept on the CPU).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiny_sd15
import torch
import torch.nn.functional as F
from comfy_server import ComfyServer, PromptFailed
from steadfast_workflows import add, build_lora, cached_nodes, hash_of, only, record_of, run, text, workflow

from steadfast.core.determinism import portable
from steadfast.core.optimize import attention as attn_mod

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[2]
# not `from conftest import ...`: the GPU protocol collects this file beside tests/core, whose conftest then wins
TINY_CKPT_NAME = tiny_sd15.CHECKPOINT_NAME
LORA_NAME = "steadfast_gpu_test_lora.safetensors"


# ---------------------------------------------------------------------------------------------------------------
# Item 3: attention backends as torch's CUDA dispatcher (sdp_utils.cpp) really refuses them
# ---------------------------------------------------------------------------------------------------------------
def _qkv(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 4, 64, 64, generator=g).to("cuda", dtype) for _ in range(3))


def test_flash_plan_names_mask_and_fp32_on_cuda() -> None:
    """Item 3: CUDA flash runs fp16 without a mask, and refuses a mask and fp32: the plan lists both."""
    attn_mod.clear_sdpa_backend_cache()
    try:
        plan = attn_mod.plan_sdpa_backend("flash", "cuda", torch.float16)
    except attn_mod.UnsupportedBackendError as e:
        pytest.skip(f"flash attention does not run on this GPU at all: {e}")
    assert "torch.float16 with an attention mask" in plan.falls_back
    assert "torch.float32" in plan.falls_back


def test_cudnn_refused_up_front_under_a_strict_policy_on_cuda() -> None:
    """Item 3: torch refuses cuDNN attention under strict deterministic algorithms: refused at planning."""
    try:
        attn_mod.check_sdpa_backend("cudnn", "cuda", torch.bfloat16)
    except attn_mod.UnsupportedBackendError as e:
        pytest.skip(f"cuDNN attention does not run on this GPU at all: {e}")
    with pytest.raises(attn_mod.UnsupportedBackendError, match="strict deterministic"):
        attn_mod.plan_sdpa_backend("cudnn", "cuda", torch.bfloat16, deterministic=True)


def test_pinned_flash_falls_back_per_call_with_a_mask_on_cuda() -> None:
    """Item 3: a masked call under a flash pin runs on torch's own choice, equal to an unpinned call, counted."""
    q, k, v = _qkv(torch.float16)
    mask = torch.zeros(1, 1, 64, 64, device="cuda", dtype=torch.float16)
    before = attn_mod.fallback_counts()
    out = attn_mod.run_pinned("flash", F.scaled_dot_product_attention, q, k, v, attn_mask=mask, why="masked")
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert attn_mod.fallbacks_since(before) == ["flash -> auto: 1 calls (masked)"]


# ---------------------------------------------------------------------------------------------------------------
# Item 8: CUBLAS_WORKSPACE_CONFIG judged by a cuBLAS call, not by CUDA's initialisation
# ---------------------------------------------------------------------------------------------------------------
def _cublas_effective(first: str) -> bool:
    code = (
        "import os, sys, types, torch\n"
        "os.environ.pop('CUBLAS_WORKSPACE_CONFIG', None)\n"
        "torch.cuda.init()\n"
        "if sys.argv[1] == 'matmul':\n"
        "    a = torch.ones(64, 64, device='cuda'); (a @ a).sum().item()\n"
        "pkg = types.ModuleType('steadfast'); pkg.__path__ = [sys.argv[2]]; sys.modules['steadfast'] = pkg\n"
        "from steadfast.core.determinism import cublas as c\n"
        "print('EFFECTIVE', c.ensure_cublas_workspace_config(), c.cublas_problem())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, first, str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("EFFECTIVE "))
    return line.split()[1] == "True"


def test_cublas_config_judged_on_a_real_gpu() -> None:
    """Item 8: CUDA initialised without a cuBLAS call: the setting is in time (no warning); after a matmul it may
    not be (warning)."""
    assert _cublas_effective("init-only") is True
    assert _cublas_effective("matmul") is False


# ---------------------------------------------------------------------------------------------------------------
# Item 7: a pipeline stays on the CPU and visits the GPU for the call
# ---------------------------------------------------------------------------------------------------------------
def test_pipeline_moves_to_the_gpu_only_for_the_call(tmp_path: Path) -> None:
    import pipeline_fixtures as tp

    from steadfast.core.pipelines import generate
    from steadfast.core.pipelines.load import on_run_device

    pipe = tp.fresh(tp.tiny_dir(tmp_path, "sd"), device="cuda", keep_on_cpu=True)
    rooms, seen = [], []
    pipe.unet.register_forward_pre_hook(lambda m, a: seen.append(next(m.parameters()).device.type))
    with on_run_device(pipe, lambda n, d: rooms.append((n, d.type))):
        images = generate(pipe, "a cat", seed=1, steps=tp.STEPS, width=tp.SIZE, height=tp.SIZE, output_type="pt")
    assert rooms and rooms[0][1] == "cuda" and rooms[0][0] > 0
    assert set(seen) == {"cuda"}
    assert all(p.device.type == "cpu" for p in pipe.unet.parameters())
    assert images.std() > 0


# ---------------------------------------------------------------------------------------------------------------
# Items 1, 2, 4, 5, 6, 9 through ComfyUI on the GPU (0.33: Dynamic VRAM on by default on NVIDIA)
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lora_file(tiny_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lora") / LORA_NAME
    build_lora(tiny_ckpt, path)
    return path


@pytest.fixture(scope="module")
def gpu_server(comfyui_path: Path, tiny_ckpt: Path, lora_file: Path) -> Iterator[ComfyServer]:
    with ComfyServer(
        {TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path, cpu=False, loras={LORA_NAME: lora_file}
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def legacy_server(comfyui_path: Path, tiny_ckpt: Path, lora_file: Path) -> Iterator[ComfyServer]:
    with ComfyServer(
        {TINY_CKPT_NAME: tiny_ckpt},
        comfyui=comfyui_path,
        cpu=False,
        loras={LORA_NAME: lora_file},
        extra_args=["--disable-dynamic-vram"],
    ) as srv:
        yield srv


def _lora_optimized(**optimize: Any) -> dict[str, Any]:
    """ckpt -> LoRA -> Optimize(**optimize) -> sampler 7, and ckpt -> LoRA -> sampler 6, into Compare 14."""
    wf = workflow("optimized_vs_baseline", steps=2)
    lora = add(wf, "LoraLoaderModelOnly", model=["1", 0], lora_name=LORA_NAME, strength_model=1.0)
    wf["6"]["inputs"]["model"] = [lora, 0]
    wf["13"]["inputs"].update(
        {
            "model": [lora, 0],
            "compile": "off",
            "qkv_fusion": False,
            "attention": "auto",
            "backend": "eager",
            **optimize,
        }
    )
    return only(wf, "14")


def _dynamic(server: ComfyServer) -> bool:
    rec = record_of(run(server, _lora_optimized()), "6")
    return bool(rec["fingerprint"]["dynamic_vram"])


def test_record_names_dynamic_vram_fast_disk_compiler_and_cuda_graphs(gpu_server: ComfyServer) -> None:
    """Item 6: the run record names each switch (None where this ComfyUI lacks it)."""
    fp = record_of(run(gpu_server, _lora_optimized()), "6")["fingerprint"]
    for key in ("dynamic_vram", "fast_disk", "cuda_graphs", "comfy_compiler"):
        assert key in fp, key
    assert fp["device"].startswith("cuda")


def test_dynamic_vram_qkv_channels_last_not_applied_and_quantize_refused(gpu_server: ComfyServer) -> None:
    """Items 1, 5 under a real Dynamic VRAM load."""
    if not _dynamic(gpu_server):
        pytest.skip("Dynamic VRAM is not active on this GPU/ComfyUI (comfy-aimdo unavailable)")
    entry = run(gpu_server, _lora_optimized(qkv_fusion=True, channels_last=True))
    rec = record_of(entry, "7")
    assert rec["fingerprint"]["qkv_fusion"] == "not applied: Dynamic VRAM"
    assert rec["fingerprint"]["channels_last"] == "not applied: Dynamic VRAM"
    with pytest.raises(PromptFailed, match="under Dynamic VRAM"):
        run(gpu_server, _lora_optimized(quantize="int8-dynamic"))


def test_dynamic_vram_compile_runs_on_the_non_dynamic_clone(gpu_server: ComfyServer) -> None:
    """Item 6: compile=regional (eager backend) on a Dynamic VRAM model compiles the non-dynamic clone, and equals
    the same model uncompiled bit for bit (eager runs the same ATen ops)."""
    if not _dynamic(gpu_server):
        pytest.skip("Dynamic VRAM is not active on this GPU/ComfyUI (comfy-aimdo unavailable)")
    entry = run(gpu_server, _lora_optimized(compile="regional", attention="math"))
    assert "model.clone(disable_dynamic=True)" in text(entry, "13")
    assert record_of(entry, "7")["compile"] != "off"


def _log(server: ComfyServer) -> list[str]:
    """The server's log so far, by line (ComfyUI logs ``model_type`` for each diffusion model it builds)."""
    return server.log_path.read_text(errors="replace").splitlines()


def test_dynamic_vram_optimize_run_again_loads_no_weights_again(gpu_server: ComfyServer) -> None:
    """Issue 35 (the 2.7x under Dynamic VRAM): a prompt without Optimize Model evicts its output, so the next prompt
    with it executes it again. That execution compiles a clone of the same non-dynamic copy: no diffusion model is
    built again (ComfyUI logs ``model_type`` for each one it builds) and the bytes are the first prompt's. CPU twin:
    ``test_dynamic_vram.py::test_optimize_executed_again_reuses_the_non_dynamic_copy``."""
    if not _dynamic(gpu_server):
        pytest.skip("Dynamic VRAM is not active on this GPU/ComfyUI (comfy-aimdo unavailable)")
    wf = workflow("optimized_vs_baseline", steps=2)
    wf["13"]["inputs"].update({"compile": "regional", "backend": "eager", "qkv_fusion": False, "attention": "auto"})
    h = add(wf, "SteadfastHash", latent=["7", 0])
    with_optimize, without = only(wf, h), only(wf, "6")
    first = run(gpu_server, with_optimize)
    run(gpu_server, without)
    seen = len(_log(gpu_server))
    again = run(gpu_server, with_optimize)
    new_lines = _log(gpu_server)[seen:]
    if "13" in cached_nodes(again):
        pytest.skip("this ComfyUI kept Optimize Model's output across the prompt without it: nothing ran again")
    assert not [line for line in new_lines if "model_type" in line], new_lines
    assert hash_of(again, h) == hash_of(first, h)


def test_dynamic_vram_lora_and_optimize_run_again_load_no_weights_again(gpu_server: ComfyServer) -> None:
    """Issue 35, the LoRA case: ckpt -> LoRA -> Optimize, ckpt -> Optimize and a KSampler prompt in turn. The prompt
    without the LoRA evicts the LoRA loader's output, so it executes again and returns a new Dynamic VRAM patcher;
    Optimize's non-dynamic copy is kept per base module, so no diffusion model is built again (no ``model_type``
    log line after the first prompt), each workflow gives its first bytes again (the LoRA unpatched from and patched
    into the shared copy as ComfyUI does for any clones of one module), and the LoRA changes them. CPU twin:
    ``test_dynamic_vram.py::test_optimize_executed_again_reuses_the_non_dynamic_copy``."""
    if not _dynamic(gpu_server):
        pytest.skip("Dynamic VRAM is not active on this GPU/ComfyUI (comfy-aimdo unavailable)")
    wf = workflow("optimized_vs_baseline", steps=2)
    wf["13"]["inputs"].update({"compile": "regional", "backend": "eager", "qkv_fusion": False, "attention": "auto"})
    plain_hash = add(wf, "SteadfastHash", latent=["7", 0])
    plain, without = only(wf, plain_hash), only(wf, "6")
    lora = add(wf, "LoraLoaderModelOnly", model=["1", 0], lora_name=LORA_NAME, strength_model=1.0)
    wf["13"]["inputs"]["model"] = [lora, 0]
    lora_hash = add(wf, "SteadfastHash", latent=["7", 0])
    with_lora = only(wf, lora_hash)
    first_lora = hash_of(run(gpu_server, with_lora), lora_hash)
    seen = len(_log(gpu_server))
    first_plain = hash_of(run(gpu_server, plain), plain_hash)
    run(gpu_server, without)
    again = run(gpu_server, with_lora)
    plain_again = hash_of(run(gpu_server, plain), plain_hash)
    new_lines = _log(gpu_server)[seen:]
    if lora in cached_nodes(again):
        pytest.skip("this ComfyUI kept the LoRA loader's output across the prompts without it: nothing ran again")
    assert not [line for line in new_lines if "model_type" in line], new_lines
    assert hash_of(again, lora_hash) == first_lora != first_plain == plain_again


def test_model_digest_equal_with_and_without_dynamic_vram(gpu_server: ComfyServer, legacy_server: ComfyServer) -> None:
    """Item 4: the same checkpoint + LoRA gives the same model digest whether ComfyUI patched the Parameters
    (legacy) or applies the LoRA at cast time (Dynamic VRAM)."""
    a = record_of(run(gpu_server, _lora_optimized()), "6")["model"]
    b = record_of(run(legacy_server, _lora_optimized()), "6")["model"]
    assert a["patched_keys"] > 0
    assert a["digest"] == b["digest"] and a["base_digest"] == b["base_digest"]


def test_quantize_with_lora_on_legacy_loading_keeps_the_lora(legacy_server: ComfyServer) -> None:
    """Item 1 (legacy, fully loaded): quantize builds from LoRA-patched weights; the output differs from the plain
    LoRA model only by quantization (not refused, and not equal to the no-LoRA model)."""
    entry = run(legacy_server, _lora_optimized(quantize="int8-dynamic"))
    assert "quantize: int8-dynamic" in text(entry, "13")
    assert record_of(entry, "7")["model"]["patched_keys"] > 0


def test_fp8_unet_attention_auto_on_gpu(comfyui_path: Path, tiny_ckpt: Path) -> None:
    """Item 2 on a GPU: fp8 weights, Optimize Model attention auto and pinned math run; probed in the compute dtype."""
    wf = workflow("optimized_vs_baseline", steps=2)
    wf["6"]["inputs"]["model"] = ["1", 0]
    wf["13"]["inputs"].update({"model": ["1", 0], "compile": "off", "qkv_fusion": False, "attention": "auto"})
    with ComfyServer(
        {TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path, cpu=False, extra_args=["--fp8_e4m3fn-unet"]
    ) as srv:
        entry = run(srv, only(wf, "14"))
    rec = record_of(entry, "7")
    assert "float8_e4m3fn" in rec["fingerprint"]["dtype"] and rec["fingerprint"]["attention"] == "pytorch_sdpa:auto"


def test_portable_mode_refuses_a_cuda_model(comfyui_path: Path, tiny_ckpt: Path) -> None:
    """Item 9: in portable mode a model on the GPU is refused with a message naming --cpu."""
    try:
        env = portable.portable_env()
    except (portable.PortableModeError, ValueError) as e:
        pytest.skip(f"portable mode cannot start on this CPU: {e}")
    wf = only(workflow("determinism_check", steps=2), "11")
    with ComfyServer({TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path, cpu=False, env=env) as srv:
        with pytest.raises(PromptFailed, match="--cpu"):
            run(srv, wf)
