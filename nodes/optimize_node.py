"""Steadfast Optimize Model: QKV fusion, channels-last, SDPA backend, precision, quantization, (regional) compile.

Diffusers pipelines have their own node, Pipeline Optimize (``nodes/pipeline_optimize_node.py``); both
declare their shared widgets from :mod:`.inputs`.
"""

from __future__ import annotations

import comfy.model_management
from comfy_api.v0_0_2 import io, ui

from ..core.determinism import portable
from ..core.optimize.plan import OptimizeOptions, Step, StepReport, run_steps
from . import inputs as oi
from .patches import attention as attention_patch
from .patches import compile as compile_patch
from .patches import dynamic_vram
from .patches import layout as layout_patch
from .patches import precision as precision_patch
from .patches import qkv as qkv_patch
from .patches import quantize as quantize_patch


def model_options(
    qkv_fusion: bool,
    channels_last: bool,
    attention: str,
    compile: str,
    backend: str,
    mode: str,
    dynamic: str,
    fullgraph: bool,
    strict_recompiles: bool = False,
    compile_cache: str = "",
    precision: str = "model",
    inductor_preset: str = "none",
    quantize: str = "off",
) -> OptimizeOptions:
    """Optimize Model's widget values, validated, as an :class:`~..core.optimize.plan.OptimizeOptions` (the plan type
    the pipeline path uses too): the ``compile`` widget is the scope; the compile widgets are held whole, mapped by
    :func:`.inputs.compile_settings` (the same mapping as Pipeline Optimize's) when compiling, and without
    the preset when not (a preset has no effect then, and the report says so).

    Raises:
        ValueError: ``quantize`` not available here (``quantize: ...``), a preset with a backend other than
            inductor while compiling, or an unknown scope.
    """
    why = oi.check_quantize(quantize)
    if why is not True:
        raise ValueError(f"quantize: {why}")
    settings = (
        oi.compile_settings(backend, mode, dynamic, fullgraph, inductor_preset)
        if compile != "off"
        else oi.compile_settings(backend, mode, dynamic, fullgraph)
    )  # ValueError: a preset, not inductor
    return OptimizeOptions(
        qkv_fusion=qkv_fusion,
        channels_last=channels_last,
        attention=attention,
        scope=compile,
        compile=settings,
        precision=precision,
        quantize=quantize,
        inductor_preset=inductor_preset,
        strict_recompiles=strict_recompiles,
        compile_cache=compile_cache,
    )


def optimize_model(model, opts: OptimizeOptions, device) -> tuple[object, list[StepReport]]:
    """Run Optimize Model's ordered plan on a clone of ``model``: Dynamic VRAM note -> precision -> attention ->
    qkv_fusion -> channels_last -> (preset note) -> quantize -> compile (structural changes first, compiling last).

    Args:
        model: the input ComfyUI ``ModelPatcher`` (not modified).
        opts: the validated plan (:func:`model_options`).
        device: the torch device the model runs on.
    Returns:
        ``(clone, step reports in order)``; the node's report is their text, line by line.
    Raises:
        ValueError: refused up front (portable mode, the Comfy Compiler), or by a step (precision, regional compile
            without blocks, quantize under Dynamic VRAM or on this device); UnsupportedBackendError (attention).
    """
    portable.check_optimize(
        compile=opts.scope, backend=opts.compile.backend, quantize=opts.quantize, precision=opts.precision
    )
    patches_forwards = [
        n
        for n, on in (
            ("qkv_fusion", opts.qkv_fusion and not dynamic_vram.is_dynamic(model)),
            (f"compile={opts.scope}", opts.scope != "off"),
            (f"quantize={opts.quantize}", opts.quantize != "off"),
        )
        if on
    ]
    if patches_forwards:
        dynamic_vram.check_comfy_compiler(", ".join(patches_forwards))  # ValueError naming --disable-comfy-compiler
    m = dynamic_vram.compile_clone(model) if opts.scope != "off" else model.clone()
    steps: list[StepReport] = []

    def dtype() -> str:
        return next(s for s in steps if s.step == "precision").details["dtype"]

    plan = [
        Step(
            "dynamic_vram",
            dynamic_vram.is_dynamic(model) and not dynamic_vram.is_dynamic(m),
            lambda: StepReport(
                "dynamic_vram",
                True,
                note="compiling a non-dynamic copy",
                lines=[
                    (
                        "Dynamic VRAM: compiling a non-dynamic copy (model.clone(disable_dynamic=True), as ComfyUI's "
                        "TorchCompileModel), made once per base model and reused by every patcher of it (LoRA "
                        "clones too) and whenever this node runs again; its weights are loaded again and patched the "
                        "classic way"
                    )
                ],
            ),
        ),
        Step("precision", True, lambda: precision_patch.add_precision(m, opts.precision)),
        Step(
            "attention",
            True,
            lambda: attention_patch.add_attention(m, opts.attention, device, dtype(), compiling=opts.scope != "off"),
        ),
        Step("qkv_fusion", opts.qkv_fusion, lambda: qkv_patch.add_qkv_fusion(m)),
        Step("channels_last", opts.channels_last, lambda: layout_patch.add_channels_last(m)),
        Step(
            "inductor_preset",
            opts.scope == "off" and opts.inductor_preset != "none",
            lambda: StepReport(
                "inductor_preset",
                False,
                note="compile is off",
                lines=[f"inductor_preset {opts.inductor_preset}: no effect (compile is off)"],
            ),
        ),
        Step("quantize", opts.quantize != "off", lambda: quantize_patch.add_quantize(m, opts.quantize, device)),
        Step("compile", opts.scope != "off", lambda: compile_patch.compile_model(m, opts)),
    ]
    return m, run_steps(plan, into=steps)


class SteadfastOptimizeModel(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastOptimizeModel",
            is_output_node=True,  # its report is shown again when ComfyUI answers from cache
            display_name="Optimize Model (Steadfast)",
            category="Steadfast",
            description="Returns a copy of the model with speed optimizations. Each may change output bits: use "
            "Compare against the unoptimized model to measure by how much. Compilation happens on the "
            "first run (or in Warmup); the compile state is shown on Warmup and at "
            "/steadfast/compile_state.",
            inputs=[
                io.Model.Input("model", tooltip="The MODEL to optimize. It is cloned, never modified."),
                *oi.layout_inputs(),
                oi.attention_input(model=True),
                *oi.compile_inputs(),
                *oi.strict_and_cache_inputs(),
                *oi.knob_inputs(),
                oi.quantize_input(),
            ],
            outputs=[
                io.Model.Output(display_name="MODEL", tooltip="The optimized clone."),
                io.String.Output(display_name="report", tooltip="What was applied, and to which blocks."),
            ],
        )

    @classmethod
    def validate_inputs(cls, compile_cache: str = "") -> bool | str:
        # compile_cache only: ComfyUI keeps its own combo/min/max checks for every other input, and marks every
        # argument of validate_inputs as at fault when it fails; quantize is checked first thing in execute()
        return oi.check_compile_cache(compile_cache)

    @classmethod
    def execute(
        cls,
        model,
        qkv_fusion: bool,
        channels_last: bool,
        attention: str,
        compile: str,
        backend: str,
        mode: str,
        dynamic: str,
        fullgraph: bool,
        strict_recompiles: bool = False,
        compile_cache: str = "",
        precision: str = "model",
        inductor_preset: str = "none",
        quantize: str = "off",
    ) -> io.NodeOutput:
        opts = model_options(
            qkv_fusion,
            channels_last,
            attention,
            compile,
            backend,
            mode,
            dynamic,
            fullgraph,
            strict_recompiles,
            compile_cache,
            precision,
            inductor_preset,
            quantize,
        )
        m, steps = optimize_model(model, opts, comfy.model_management.get_torch_device())
        report = "\n".join(line for s in steps for line in s.lines)
        return io.NodeOutput(m, report, ui=ui.PreviewText(report))
