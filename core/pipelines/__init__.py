"""diffusers pipelines with Steadfast's optimizations, reproducible generation and LoRA hot-swapping.

Plain-Python API (no ComfyUI imports; diffusers is imported lazily, on first use)::

    pipe = load_pipeline("path/to/pipeline", dtype="fp32")
    report = optimize_pipeline(pipe, OptimizeOptions(qkv_fusion=True, channels_last=True, scope="regional"))
    warmup(pipe, width=512, height=512)
    images = generate(pipe, "a cat", steps=20, seed=1, batch=2)   # [2, 512, 512, 3] float32 in [0, 1]

Modules: :mod:`.load` (folder checks, dtype, components), :mod:`.optimize` (ordered application of
:mod:`core.optimize.plan`'s options, steps and reports, the plan type the MODEL path shares), :mod:`.attention`
(backend choice), :mod:`.run` (generation, warm-up, reports), :mod:`.lora` (LoRA and hot-swap), :mod:`.state`
(per-pipeline bookkeeping).
"""

from ..optimize.plan import OptimizeOptions, OptimizeReport, StepReport
from .attention import UnsupportedAttentionError, attention_names
from .load import DTYPES, PipelineLoadError, count_params, denoiser_of, load_pipeline, module_components
from .lora import LoraLoadError, LoraReport, adapter_components, load_lora, prepare_lora_hotswap
from .optimize import PipelineStateError, optimize_pipeline
from .run import WarmupResult, compile_record, generate, image_generators, pipeline_report, warmup

__all__ = [
    "DTYPES",
    "LoraLoadError",
    "LoraReport",
    "OptimizeOptions",
    "OptimizeReport",
    "PipelineLoadError",
    "PipelineStateError",
    "StepReport",
    "UnsupportedAttentionError",
    "WarmupResult",
    "adapter_components",
    "attention_names",
    "compile_record",
    "count_params",
    "denoiser_of",
    "generate",
    "image_generators",
    "load_lora",
    "load_pipeline",
    "module_components",
    "optimize_pipeline",
    "pipeline_report",
    "prepare_lora_hotswap",
    "warmup",
]
