"""Settings of the running ComfyUI that touch determinism: what the run record names, and what breaks equality.

ComfyUI has added, since 0.8.0, features that change output bits or break run-to-run equality: Dynamic VRAM
(comfy-aimdo, the default on NVIDIA GPUs from 0.1x on), comfy-kitchen kernels, and ``--fast`` options
(``fp16_accumulation``, ``fp8_matrix_mult``, ``cublas_ops``, ``autotune``: ``comfy/cli_args.py``
``PerformanceFeature``). The node layer (``nodes/host/identity.py``) reads them from the running server into a plain
dict; this module, which imports nothing from ComfyUI, says which of them are known to break run-to-run equality,
so that the detection can be tested on any machine.

The dict (``ComfyEnvironment`` fields, all JSON): ``comfyui`` (version), ``comfy_aimdo`` / ``comfy_kitchen``
(installed versions, or None), ``dynamic_vram`` (bool: ComfyUI's ``comfy.memory_management.aimdo_enabled``),
``comfy_fast`` (sorted ``--fast`` option values), ``comfy_numeric_args`` (the numeric command-line switches that
are set, e.g. ``{"force_fp16": true}``), ``fast_disk`` / ``cuda_graphs`` / ``comfy_compiler`` (ComfyUI 0.33's
loading switches; None where absent) and ``fp16_accumulation`` (``torch.backends.cuda.matmul.
allow_fp16_accumulation`` where torch has it).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NUMERIC_ARGS", "run_to_run_risks"]

#: ComfyUI command-line switches that change which dtype or attention runs (``comfy/cli_args.py``), recorded when
#: set. Names not present in a ComfyUI version are skipped.
NUMERIC_ARGS = (
    "force_fp32", "force_fp16", "fp32_unet", "fp64_unet", "bf16_unet", "fp16_unet", "fp8_e4m3fn_unet",
    "fp8_e5m2_unet", "fp8_e8m0fnu_unet", "fp16_vae", "fp32_vae", "bf16_vae", "cpu_vae", "fp8_e4m3fn_text_enc",
    "fp8_e5m2_text_enc", "fp16_text_enc", "fp32_text_enc", "bf16_text_enc", "force_upcast_attention",
    "dont_upcast_attention", "use_split_cross_attention", "use_quad_cross_attention", "use_pytorch_cross_attention",
    "use_sage_attention", "use_flash_attention", "disable_xformers", "deterministic", "disable_smart_memory",
)


def run_to_run_risks(env: Mapping[str, Any]) -> list[str]:
    """Settings of the running ComfyUI known to break run-to-run equality, each as one plain sentence.

    Args:
        env: the ComfyUI environment dict (module docstring); missing keys count as "not in use".
    Returns:
        One line per known risk (empty when none is known): what is on, what upstream reported, what to do.
        Sources: ComfyUI issues 16490 (Dynamic VRAM restores a ``ModelSamplingDiscrete`` schedule into later
        runs of the same checkpoint) and 15365 (LoRA-patched fp8 weights not run-to-run deterministic under
        comfy-aimdo); ``--fast autotune`` sets ``torch.backends.cudnn.benchmark`` (``comfy/model_management.py``),
        which picks convolution algorithms by timing.
    """
    risks = []
    if env.get("dynamic_vram"):
        risks.append(
            "Dynamic VRAM (comfy-aimdo) is active: upstream reports state leaking between runs of the same "
            "checkpoint (ComfyUI issue 16490: a ModelSamplingDiscrete schedule kept after the node is removed) and "
            "LoRA-patched fp8 weights differing run to run (issue 15365). For run-to-run equality start ComfyUI "
            "with --disable-dynamic-vram.")
    if env.get("fast_disk"):
        risks.append("--fast-disk is on: weights are loaded from disk-backed memory, which upstream reports changes "
                     "outputs (ComfyUI issue 15528). For run-to-run equality start ComfyUI without --fast-disk.")
    if env.get("comfy_compiler") == "on":
        risks.append("the Comfy Compiler is on (memory compiler + CUDA graphs with Dynamic VRAM): Optimize Model "
                     "refuses compile, qkv_fusion and quantize under it; start ComfyUI with --disable-comfy-compiler "
                     "to use them.")
    fast = set(env.get("comfy_fast") or ())
    if "autotune" in fast:
        risks.append("--fast autotune turns cuDNN benchmark on for the whole server (convolution algorithms chosen "
                     "by timing): Determinism Setup turns it off around sampling only, so VAE decoding and other "
                     "nodes still vary. Start ComfyUI without it for run-to-run equality.")
    return risks
