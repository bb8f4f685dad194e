"""Steadfast Optimize Model: QKV fusion, channels-last, SDPA backend, precision, quantization, (regional) compile.

Diffusers pipelines have their own node, Pipeline Optimize (``nodes/pipeline_optimize_node.py``); both
declare their shared widgets from :mod:`.optimize_inputs`.
"""
from __future__ import annotations

from comfy_api.v0_0_2 import io, ui

import comfy.model_management

from ..core.compile import blocks, registry
from ..core.determinism import portable
from ..core.compile.guards import comfy_guard_filter
from ..core.optimize import quantize as qz
from . import model_patches as mp
from . import optimize_inputs as oi
from . import quantize_patch


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
                        "first run (or in Warmup); the compile state is shown on Warmup and at /steadfast/compile_state.",
            inputs=[
                io.Model.Input("model", tooltip="The MODEL to optimize. It is cloned, never modified."),
                *oi.layout_inputs(),
                oi.attention_input(model=True),
                *oi.compile_inputs(),
                *oi.strict_and_cache_inputs(),
                *oi.knob_inputs(),
                oi.quantize_input(),
            ],
            outputs=[io.Model.Output(display_name="MODEL", tooltip="The optimized clone."),
                     io.String.Output(display_name="report", tooltip="What was applied, and to which blocks.")],
        )

    @classmethod
    def validate_inputs(cls, compile_cache: str = "") -> bool | str:
        # compile_cache only: ComfyUI keeps its own combo/min/max checks for every other input, and marks every
        # argument of validate_inputs as at fault when it fails; quantize is checked first thing in execute()
        return oi.check_compile_cache(compile_cache)

    @classmethod
    def execute(cls, model, qkv_fusion: bool, channels_last: bool, attention: str, compile: str,
                backend: str, mode: str, dynamic: str, fullgraph: bool, strict_recompiles: bool = False,
                compile_cache: str = "", precision: str = "model", inductor_preset: str = "none",
                quantize: str = "off") -> io.NodeOutput:
        why = oi.check_quantize(quantize)
        if why is not True:
            raise ValueError(f"quantize: {why}")
        portable.check_optimize(compile=compile, backend=backend, quantize=quantize, precision=precision)
        lines: list[str] = []
        patches_forwards = [n for n, on in (("qkv_fusion", qkv_fusion and not mp.is_dynamic(model)),
                                            (f"compile={compile}", compile != "off"),
                                            (f"quantize={quantize}", quantize != "off")) if on]
        if patches_forwards:
            mp.check_comfy_compiler(", ".join(patches_forwards))  # ValueError naming --disable-comfy-compiler
        m = mp.compile_clone(model) if compile != "off" else model.clone()
        dyn_vram = mp.is_dynamic(m)  # not `dynamic`: that is the compile widget
        if mp.is_dynamic(model) and not dyn_vram:
            lines.append("Dynamic VRAM: compiling a non-dynamic copy (model.clone(disable_dynamic=True), as ComfyUI's "
                         "TorchCompileModel); its weights are loaded again and patched the classic way")
        device = comfy.model_management.get_torch_device()
        dtype = mp.set_precision(m, precision) or mp.compute_dtype(m)  # ValueError for a dtype the device lacks
        if precision != "model":
            lines.append(f"precision: {precision}, compute {dtype} (weights {m.model.get_dtype()}; ComfyUI's "
                         "set_model_compute_dtype)" + ("" if precision == "fp32" else ": changes bits vs fp32"))

        if attention != "comfy":
            # probed in the compute dtype (fp8 weights compute in manual_cast_dtype), with a mask, in fp32, and
            # under the model's strict policy: UnsupportedBackendError names the cases and what runs there
            plan = mp.plan_attention(m, attention, device)
            mp.set_attention(m, attention)
            lines.append(f"attention: PyTorch SDPA, backend {attention} on {device} ({dtype}); {plan.as_text()}")
        elif compile != "off":
            mp.keep_comfy_attention(m)
            lines.append("attention: ComfyUI default (kept explicitly, so compiled graphs guard on it)")
        else:
            lines.append("attention: ComfyUI default (not pinned)")

        if qkv_fusion and dyn_vram:  # fused_project takes the separate path whenever comfy_cast_weights is set
            mp.steadfast_options(m)["qkv_fusion"] = mp.NOT_APPLIED_DYNAMIC
            lines.append(f"qkv_fusion: {mp.NOT_APPLIED_DYNAMIC} (weights are cast per call; compile, or start ComfyUI "
                         "with --disable-dynamic-vram, to fuse)")
        elif qkv_fusion:
            n = mp.add_qkv_fusion(m)
            lines.append(f"qkv_fusion: {n} attention modules fused" if n else
                         "qkv_fusion: nothing to fuse (this architecture has no separate q/k/v projections)")
        if channels_last and dyn_vram:  # weights reach the GPU as gathered contiguous copies: leave the mapped ones
            mp.steadfast_options(m)["channels_last"] = mp.NOT_APPLIED_DYNAMIC
            lines.append(f"channels_last: {mp.NOT_APPLIED_DYNAMIC} (the memory-mapped weights are left alone)")
        elif channels_last:
            mp.add_channels_last(m)
            lines.append("channels_last: conv weights converted during sampling, restored after")

        if compile == "off" and inductor_preset != "none":
            lines.append(f"inductor_preset {inductor_preset}: no effect (compile is off)")
        if quantize != "off":
            if dyn_vram:
                raise ValueError(f"quantize={quantize} under Dynamic VRAM: ComfyUI applies LoRA and other weight "
                                 "patches at cast time there, and the quantized layers would be built from unpatched "
                                 "weights (a LoRA silently dropped) while the full-precision weights stay on the GPU "
                                 "uncounted. Turn compile on (it runs a non-dynamic copy), or start ComfyUI with "
                                 "--disable-dynamic-vram, or set quantize to off.")
            qz.check_supported(quantize, device)
            choice = quantize_patch.add_quantize(m, quantize)
            lines.append(f"quantize: {quantize} (torchao), {choice.as_text()}; built at the first run from the "
                         "weights as patched (LoRA included)")

        if compile != "off":
            options = oi.compile_settings(backend, mode, dynamic, fullgraph, inductor_preset)  # ValueError: not inductor
            diffusion_model = m.get_model_object("diffusion_model")
            if compile == "regional":
                choice = blocks.choose_blocks(diffusion_model)
                if not choice.paths:
                    raise ValueError(f"regional compile for {type(diffusion_model).__name__}: {choice.as_text()}; "
                                     "use compile=full for this model")
                keys = [f"diffusion_model.{p}" for p in choice.paths]
                lines.append("compile: regional, " + choice.as_text())
            else:
                keys = ["diffusion_model"]
                lines.append("compile: full diffusion_model")
            record, created = registry.REGISTRY.get_or_create(
                m.model, options, keys, label=f"{type(diffusion_model).__name__} ({compile})",
                guard_filter_fn=comfy_guard_filter(), strict=strict_recompiles)
            cache, cache_line = mp.open_compile_cache(backend, compile_cache, dict(options.options or {}))
            mp.add_compile(m, record, compile, cache, strict=strict_recompiles, inductor_preset=inductor_preset)
            lines.append(cache_line)
            if attention == "comfy":
                lines.append("WARNING: compiling with ComfyUI's own attention (sub_quad on CPU) graph-breaks and "
                             "recompiles often (measured: 15 graphs, 9 recompiles in 4 steps); pick an SDPA backend")
            lines.append(f"  {options.as_text()}")
            lines.append(f"  {'new' if created else 'reused'} compile record ({record.stats.status}); compiles "
                         "lazily on the first run or in Warmup")
            if inductor_preset != "none":
                lines.append(f"inductor_preset: {inductor_preset} (options above"
                             + ("; a compile cache directory of its own)" if cache is not None else ")"))
            if strict_recompiles:
                lines.append("strict_recompiles: a recompile after warm-up fails the run, with its reason")
            if not created:  # what this model has compiled so far (recompiles with reasons, warnings)
                lines.append(record.as_text())
        report = "\n".join(lines)
        mp.steadfast_options(m)["optimize_report"] = report
        return io.NodeOutput(m, report, ui=ui.PreviewText(report))
