"""Pipeline Optimize: DIFFUSERS_PIPELINE -> DIFFUSERS_PIPELINE, optimized on a weight-sharing copy.

A thin adapter over ``core.pipelines``: ``optimized_handle`` applies ``optimize_pipeline`` to a weight-sharing copy
(the input pipeline stays as it was, see ``core/pipelines/handle.py``).
"""

from __future__ import annotations

from comfy_api.v0_0_2 import io, ui

from ..core.compile.registry import REGISTRY
from ..core.determinism import portable
from ..core.optimize.plan import OptimizeOptions
from ..core.pipelines import compile_record
from ..core.pipelines.handle import optimized_handle
from ..core.pipelines.state import peek_state
from . import inputs as oi
from .host.startup import cache_choice
from .pipeline_type import DiffusersPipeline, as_handle


def compile_lines(rec, reused: bool) -> list[str]:
    """Pipeline Optimize's lines on its compile record, in the words Optimize Model uses
    (``nodes/patches/compile.py``): the record's state in one word, once ("new compile record (cold); compiles lazily
    on the first run or in Pipeline Warmup"), then, for a record that ran before, what it compiled so far. The
    frontend (``js/steadfast.js`` markWarm) turns that one word warm, naming the node, once Pipeline Warmup or a
    Pipeline Sampler downstream ran the compiled pipeline; so no other line may carry the state (before, the
    record's summary here said "cold" a second time, and stayed so beside a warm sampler). ``rec``: the pipeline's
    :class:`~..core.compile.record.CompileRecord`, or None (nothing compiled yet)."""
    if rec is None:
        return ["no compile record yet; compiles lazily on the first run or in Pipeline Warmup"]
    s = rec.summary()
    lines = [
        f"{'reused' if reused else 'new'} compile record ({s['status']}); compiles lazily on the first run or "
        "in Pipeline Warmup"
    ]  # the blocks and backend: the compile step's line above
    if s["graphs"] or s["recompiles"]:  # what it compiled so far
        last = f" (last: {str(s['last_recompile'])[:117]})" if s["last_recompile"] else ""
        lines.append(f"  {s['label']} so far: {s['graphs']} graph(s), {s['recompiles']} recompile(s){last}")
    if s["disabled"]:
        lines.append("DISABLED (running eager)")
    lines += [f"WARNING: {w}" for w in s["warnings"][-1:]]
    return lines


def pipeline_options(
    qkv_fusion: bool,
    channels_last: bool,
    attention: str,
    compile: str,
    backend: str,
    mode: str,
    dynamic: str,
    fullgraph: bool,
    vae_slicing: bool,
    vae_tiling: bool,
) -> OptimizeOptions:
    """Pipeline Optimize's widget values as an :class:`~..core.optimize.plan.OptimizeOptions` (the ``compile``
    widget is the scope; the compile widgets, held whole, mapped by :func:`.inputs.compile_settings`, the
    same mapping as Optimize Model's)."""
    return OptimizeOptions(
        qkv_fusion=qkv_fusion,
        channels_last=channels_last,
        attention=attention,
        vae_slicing=vae_slicing,
        vae_tiling=vae_tiling,
        scope=compile,
        compile=oi.compile_settings(backend, mode, dynamic, fullgraph),
    )


class SteadfastPipelineOptimize(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastPipelineOptimize",
            is_output_node=True,  # its report is shown again when ComfyUI answers from cache
            display_name="Pipeline Optimize (Steadfast)",
            category="Steadfast",
            description="Returns a copy of a diffusers pipeline (sharing its weights) with diffusers-native speed "
            "optimizations: QKV fusion, channels-last, attention backend, VAE slicing/tiling, "
            "compile_repeated_blocks. Each may change output bits: Compare against the input pipeline.",
            inputs=[
                DiffusersPipeline.Input(
                    "pipeline",
                    tooltip="The pipeline to optimize (not modified). Put Pipeline "
                    "LoRA before this node, so the copy is prepared for LoRA "
                    "hot-swap.",
                ),
                *oi.layout_inputs(),
                oi.attention_input(model=False),
                *oi.compile_inputs(),
                io.Boolean.Input(
                    "vae_slicing",
                    default=False,
                    tooltip="Decode the batch one image at a time (less memory, same pixels).",
                ),
                io.Boolean.Input(
                    "vae_tiling",
                    default=False,
                    tooltip="Decode in overlapping tiles (much less memory for large images; tile seams "
                    "blended, NOT bit-equal).",
                ),
                *oi.strict_and_cache_inputs(),
            ],
            outputs=[
                DiffusersPipeline.Output(display_name="PIPELINE", tooltip="The optimized copy."),
                io.String.Output(display_name="report", tooltip="What was applied, to which components."),
            ],
        )

    @classmethod
    def validate_inputs(cls, compile_cache: str = "") -> bool | str:
        # named arguments only: ComfyUI then keeps its own combo/min/max checks for every other input
        return oi.check_compile_cache(compile_cache)

    @classmethod
    def execute(
        cls,
        pipeline,
        qkv_fusion: bool,
        channels_last: bool,
        attention: str,
        compile: str,
        backend: str,
        mode: str,
        dynamic: str,
        fullgraph: bool,
        vae_slicing: bool,
        vae_tiling: bool,
        strict_recompiles: bool = False,
        compile_cache: str = "",
    ) -> io.NodeOutput:
        portable.check_optimize(compile=compile, backend=backend)
        handle = as_handle(pipeline, "Pipeline Optimize")
        opts = pipeline_options(
            qkv_fusion, channels_last, attention, compile, backend, mode, dynamic, fullgraph, vae_slicing, vae_tiling
        )
        if opts.is_baseline():
            report = f"{handle.describe()}: nothing switched on, returned unchanged"
            return io.NodeOutput(handle, report, ui=ui.PreviewText(report))
        cache = cache_choice(compile_cache) if opts.scope != "off" else None  # the MODEL path's cache, by name
        new, rep, reused = optimized_handle(handle, opts, cache)
        lines = [
            handle.describe(),
            "reused the copy optimized earlier from this pipeline with these options (nothing recompiled)"
            if reused
            else "optimized a copy sharing the weights (the input pipeline is unchanged)",
        ]
        lines += [s.as_text() for s in rep.steps]
        if handle.lora is not None:
            lines.append(
                f"prepared for LoRA hot-swap up to rank {handle.lora.max_rank}; the LoRA is loaded at run time"
            )
        if opts.scope != "off":
            rec = compile_record(new.pipe)
            if rec is not None:
                REGISTRY.set_strict(rec, strict_recompiles)
            lines += compile_lines(rec, reused)
            if strict_recompiles:
                lines.append("strict_recompiles: a recompile after warm-up fails the run, with its reason")
            compiled = peek_state(new.pipe).compiled
            lines += compiled.lines if compiled is not None else []
        report = "\n".join(lines)
        return io.NodeOutput(new, report, ui=ui.PreviewText(report))
