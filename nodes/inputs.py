"""The widgets several nodes share, declared once: Optimize Model's and Pipeline Optimize's (with their one mapping to
compile options, :func:`compile_settings`, so the MODEL and pipeline paths cannot drift), the determinism policy's
(Determinism Setup and Pipeline Determinism Setup) and a pipeline run's sizes (Pipeline Sampler and Pipeline Warmup).
"""

from __future__ import annotations

import comfy.model_management
from comfy_api.v0_0_2 import io

from ..core.compile import presets as inductor_presets
from ..core.compile.options import COMPILE_SCOPES, CompileOptions
from ..core.compile.warm import cache_location as compile_cache_location
from ..core.optimize import quantize as qz
from ..core.optimize.precision import PRECISIONS

SDPA_CHOICES = ["auto", "math", "efficient", "flash", "cudnn"]
MODEL_ATTENTION_CHOICES = SDPA_CHOICES + ["comfy"]  # "comfy": ComfyUI's own attention, which only MODELs have
COMPILE_CHOICES = list(COMPILE_SCOPES)  # the one list of compile choices (core.compile.options)
BACKENDS = ["inductor", "eager", "aot_eager", "cudagraphs"]
MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
DYNAMIC_CHOICES = ["auto", "true", "false"]

_SDPA_TIP = (
    "PyTorch SDPA backend for attention. auto = torch picks; math/efficient/flash/cudnn pin one kernel "
    "(an error if this device lacks it)"
)


def layout_inputs() -> list[io.Input]:
    """``qkv_fusion`` and ``channels_last`` (booleans, default off)."""
    return [
        io.Boolean.Input(
            "qkv_fusion",
            default=False,
            tooltip="Fuse the q/k/v projections of attention into one matmul (k/v for cross-attention). "
            "Bit-equal in fp32 on CPU; bf16 can differ by 1 ulp.",
        ),
        io.Boolean.Input(
            "channels_last",
            default=False,
            tooltip="Run convolutions in channels-last memory layout. Usually faster; NOT bit-equal to "
            "the default layout.",
        ),
    ]


def attention_input(*, model: bool) -> io.Combo.Input:
    """The ``attention`` combo; ``model=True`` adds "comfy" (keep ComfyUI's own attention)."""
    if model:
        return io.Combo.Input(
            "attention",
            options=MODEL_ATTENTION_CHOICES,
            default="auto",
            tooltip=_SDPA_TIP + "; comfy = keep ComfyUI's own attention (on CPU that is sub_quad, "
            "which breaks torch.compile graphs).",
        )
    return io.Combo.Input("attention", options=SDPA_CHOICES, default="auto", tooltip=_SDPA_TIP + ".")


def compile_inputs() -> list[io.Input]:
    """``compile``, ``backend``, ``mode``, ``dynamic``, ``fullgraph`` (the torch.compile settings)."""
    return [
        io.Combo.Input(
            "compile",
            options=COMPILE_CHOICES,
            default="off",
            tooltip="off; regional = compile each repeated transformer block once and reuse the graph "
            "(much shorter compile, same speed); full = compile the whole denoiser. Compiled "
            "output is run-to-run deterministic but not bit-equal to eager.",
        ),
        io.Combo.Input(
            "backend",
            options=BACKENDS,
            default="inductor",
            tooltip="torch.compile backend. inductor generates kernels; eager only traces (for testing).",
        ),
        io.Combo.Input("mode", options=MODES, default="default", tooltip="torch.compile mode preset."),
        io.Combo.Input(
            "dynamic",
            options=DYNAMIC_CHOICES,
            default="auto",
            tooltip="Dynamic shapes. true avoids recompiles when resolution or batch changes; auto lets "
            "torch mark shapes dynamic after the first change (one recompile).",
        ),
        io.Boolean.Input(
            "fullgraph",
            default=False,
            tooltip="torch.compile fullgraph: each compiled region must be one graph; a graph break "
            "is an error that fails the run (off: a graph break splits the region).",
        ),
    ]


def strict_and_cache_inputs() -> list[io.Input]:
    """``strict_recompiles`` and ``compile_cache`` (optional, after every other widget)."""
    return [
        io.Boolean.Input(
            "strict_recompiles",
            default=False,
            optional=True,
            tooltip="Make any recompile after warm-up an error naming its reason (a changed global flag, "
            "a new size, replaced weights ...) instead of a slow, counted one.",
        ),
        io.String.Input(
            "compile_cache",
            default="",
            optional=True,
            tooltip="inductor only: NAME of the persistent compile cache to use (kept across restarts), "
            "e.g. 'flux'. Empty = 'default'; 'off' = inductor's temporary folder. A name, never "
            "a path: the folder that holds the caches is set by the server's operator "
            "($STEADFAST_COMPILE_CACHE, else <ComfyUI user dir>/steadfast/compile_cache).",
        ),
    ]


QUANTIZE_CHOICES = list(qz.MODES)  # importing core.optimize.quantize does not import torchao


def quantize_input() -> io.Combo.Input:
    """``quantize`` (optional, Optimize Model only, after every other widget): torchao dynamic quantization."""
    return io.Combo.Input(
        "quantize",
        options=QUANTIZE_CHOICES,
        default="off",
        optional=True,
        tooltip="Dynamic quantization of the Linear layers with torchao (pip install torchao). "
        "int8-dynamic: int8 activations and weights, CPU and GPU; fp8-dynamic: float8, "
        "only on GPUs with compute capability >= 8.9. Output bits differ from off "
        "(run-to-run identical); a LoRA is quantized with the weights.",
    )


def check_quantize(quantize: str) -> bool | str:
    """``validate_inputs`` result for ``quantize``: True, or why this server cannot run the mode (fp8 on a
    CPU or an older GPU), so the prompt is refused before anything runs."""
    try:
        qz.check_supported(quantize, comfy.model_management.get_torch_device())
    except (qz.QuantizeUnavailable, ValueError) as e:
        return str(e)
    return True


def check_compile_cache(compile_cache: str) -> bool | str:
    """``validate_inputs`` result for the ``compile_cache`` widget: True, or why the name is refused
    (:func:`core.compile.warm.cache_location.check_name`: a name, never a path)."""
    try:
        compile_cache_location.check_name(compile_cache)
    except compile_cache_location.CacheRefused as e:
        return str(e)
    return True


def knob_inputs() -> list[io.Input]:
    """``precision`` and ``inductor_preset`` (Optimize Model only; optional, defaults change nothing)."""
    return [
        io.Combo.Input(
            "precision",
            options=list(PRECISIONS),
            default="model",
            optional=True,
            tooltip="Compute dtype of the diffusion model (ComfyUI's set_model_compute_dtype; weights stay "
            "as stored). model = as loaded. bf16/fp16 are faster on GPUs (on CPU often slower) and "
            "change output bits vs fp32 (max |diff| in docs/benchmarks.md); recorded in the run "
            "record's dtype.",
        ),
        io.Combo.Input(
            "inductor_preset",
            options=list(inductor_presets.PRESET_NAMES),
            default="none",
            optional=True,
            tooltip="inductor config preset merged into torch.compile options (backend inductor only). "
            "diffusers-fast = PyTorch's 'Diffusion, Fast' recipe: 1x1 convs as matmuls, "
            "coordinate-descent tuning, no epilogue fusion. Changes generated code, so bits "
            "(measured in docs/benchmarks.md); part of the compile cache key and run record.",
        ),
    ]


def compile_settings(
    backend: str, mode: str, dynamic: str, fullgraph: bool, inductor_preset: str = inductor_presets.NONE
) -> CompileOptions:
    """The compile widgets as :class:`CompileOptions` (mode "default" -> None; dynamic "auto" -> None,
    "true"/"false" -> bool; a preset's inductor config as options, None without one). Raises ``KeyError`` only for a
    value ComfyUI's combo check already rejects, ``ValueError`` for a preset with a backend other than inductor."""
    return CompileOptions(
        backend=backend,
        mode=None if mode == "default" else mode,
        dynamic={"auto": None, "true": True, "false": False}[dynamic],
        fullgraph=fullgraph,
        options=inductor_presets.preset_options(inductor_preset, backend) or None,
    )


__all__ = [
    "SDPA_CHOICES",
    "MODEL_ATTENTION_CHOICES",
    "COMPILE_CHOICES",
    "BACKENDS",
    "MODES",
    "DYNAMIC_CHOICES",
    "layout_inputs",
    "attention_input",
    "compile_inputs",
    "strict_and_cache_inputs",
    "check_compile_cache",
    "QUANTIZE_CHOICES",
    "quantize_input",
    "check_quantize",
    "compile_settings",
    "knob_inputs",
]


def policy_inputs(during: str) -> list[io.Input]:
    """The policy widgets Determinism Setup and Pipeline Determinism Setup share (``during``: when it applies)."""
    return [
        io.Boolean.Input(
            "strict",
            default=True,
            tooltip="On: torch raises an error when an op has no deterministic implementation. "
            "Off: torch only warns (warn_only) and the run may not be reproducible.",
        ),
        io.Boolean.Input(
            "allow_tf32",
            default=False,
            tooltip="Speed vs bits: allow TF32 matmuls/convolutions on Ampere+ GPUs. Faster, but fp32 "
            "results change and depend on the GPU generation. Off for cross-machine "
            "reproducibility. No effect on CPU (TF32 is a GPU tensor-core format).",
        ),
        io.Int.Input(
            "num_threads",
            default=0,
            min=0,
            max=1024,
            tooltip=f"CPU threads for torch while {during}. fp32 CPU results differ between thread counts, "
            "so the count is pinned and recorded. 0 = pin the current count.",
        ),
    ]


def size_inputs() -> list[io.Input]:
    """Width, height and batch size of a pipeline run (Pipeline Sampler and Pipeline Warmup)."""
    return [
        io.Int.Input(
            "width",
            default=512,
            min=16,
            max=16384,
            step=8,
            tooltip="Image width in pixels (a multiple of the pipeline's VAE factor; x2 for Flux).",
        ),
        io.Int.Input("height", default=512, min=16, max=16384, step=8, tooltip="Image height in pixels."),
        io.Int.Input("batch_size", default=1, min=1, max=4096, tooltip="Number of images; image i uses seed + i."),
    ]
