"""Steadfast Optimize Model: QKV fusion, channels-last, SDPA backend and (regional) torch.compile."""
from __future__ import annotations

from comfy_api.latest import io, ui

import comfy.model_management

from ..core import blocks, registry
from ..core import compile_cache as compile_cache_names
from ..core.compile import comfy_guard_filter
from ..core.optimize import attention as sdpa
from . import model_patches as mp
from . import pipeline_paths
from .pipeline_nodes import DiffusersPipeline

ATTENTION_CHOICES = ["auto", "math", "efficient", "flash", "cudnn", "comfy"]
COMPILE_CHOICES = ["off", "regional", "full"]
BACKENDS = ["inductor", "eager", "aot_eager", "cudagraphs"]
MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


class SteadfastOptimizeModel(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        # MODEL or DIFFUSERS_PIPELINE in, the same type out (the frontend retypes the output on connection)
        model_or_pipeline = io.MatchType.Template("model_or_pipeline", [io.Model, DiffusersPipeline])
        return io.Schema(
            node_id="SteadfastOptimizeModel",
            display_name="Optimize Model (Steadfast)",
            category="Steadfast",
            description="Returns a copy of the model with speed optimizations. Each may change output bits: use "
                        "Compare against the unoptimized model to measure by how much. Compilation happens on the "
                        "first run (or in Warmup); the compile state is shown on Warmup and at /steadfast/compile_state.",
            inputs=[
                io.MatchType.Input("model", template=model_or_pipeline,
                                   tooltip="The MODEL or DIFFUSERS_PIPELINE to optimize. A MODEL is cloned; a "
                                           "pipeline is copied sharing its weights. The input is not modified."),
                io.Boolean.Input("qkv_fusion", default=False,
                                 tooltip="Fuse the q/k/v projections of attention into one matmul (k/v for "
                                         "cross-attention). Adds no memory. Bit-equal in fp32 on CPU; bf16 can differ by 1 ulp."),
                io.Boolean.Input("channels_last", default=False,
                                 tooltip="Run convolutions in channels-last memory layout (during sampling only). "
                                         "Usually faster; NOT bit-equal to the default layout."),
                io.Combo.Input("attention", options=ATTENTION_CHOICES, default="auto",
                               tooltip="PyTorch SDPA backend for attention. auto = torch picks; math/efficient/flash/cudnn "
                                       "pin one kernel (an error if this device lacks it); comfy = keep ComfyUI's own "
                                       "attention (on CPU that is sub_quad, which breaks torch.compile graphs)."),
                io.Combo.Input("compile", options=COMPILE_CHOICES, default="off",
                               tooltip="off; regional = compile each repeated transformer block once and reuse the graph "
                                       "(much shorter compile, same speed); full = compile the whole diffusion model. "
                                       "Compiled output is run-to-run deterministic but not bit-equal to eager."),
                io.Combo.Input("backend", options=BACKENDS, default="inductor",
                               tooltip="torch.compile backend. inductor generates kernels; eager only traces (for testing)."),
                io.Combo.Input("mode", options=MODES, default="default", tooltip="torch.compile mode preset."),
                io.Combo.Input("dynamic", options=["auto", "true", "false"], default="auto",
                               tooltip="Dynamic shapes. true avoids recompiles when resolution or batch changes; "
                                       "auto lets torch mark shapes dynamic after the first change (one recompile)."),
                io.Boolean.Input("fullgraph", default=False,
                                 tooltip="Require each compiled region to be one graph (an error on any graph break)."),
                io.Boolean.Input("vae_slicing", default=False, optional=True,
                                 tooltip="DIFFUSERS_PIPELINE only: decode the batch one image at a time (less memory, "
                                         "same pixels). Ignored for a MODEL."),
                io.Boolean.Input("vae_tiling", default=False, optional=True,
                                 tooltip="DIFFUSERS_PIPELINE only: decode in overlapping tiles (much less memory for "
                                         "large images; tile seams blended, NOT bit-equal). Ignored for a MODEL."),
                io.Boolean.Input("strict_recompiles", default=False, optional=True,
                                 tooltip="Make any recompile after warm-up an error naming its reason (a changed "
                                         "global flag, a new size, replaced weights ...) instead of a slow, counted one."),
                io.String.Input("compile_cache", default="", optional=True,
                                tooltip="inductor only: NAME of the persistent compile cache to use (kept across "
                                        "restarts), e.g. 'flux'. Empty = 'default'; 'off' = inductor's temporary "
                                        "folder. A name, never a path: the folder that holds the caches is set by "
                                        "the server's operator ($STEADFAST_COMPILE_CACHE, else <ComfyUI user "
                                        "dir>/steadfast/compile_cache)."),
            ],
            outputs=[io.MatchType.Output(template=model_or_pipeline, display_name="MODEL",
                                         tooltip="The optimized clone (a MODEL or a DIFFUSERS_PIPELINE, like the input)."),
                     io.String.Output(display_name="report", tooltip="What was applied, and to which blocks.")],
        )

    @classmethod
    def validate_inputs(cls, attention: str = "auto", compile: str = "off", backend: str = "inductor",
                        compile_cache: str = "", **_) -> bool | str:
        try:
            compile_cache_names.check_name(compile_cache)
        except compile_cache_names.CacheRefused as e:
            return str(e)
        if attention not in ATTENTION_CHOICES:
            return f"unknown attention backend {attention!r}; choose one of {ATTENTION_CHOICES}"
        if compile not in COMPILE_CHOICES:
            return f"unknown compile choice {compile!r}; choose one of {COMPILE_CHOICES}"
        return True

    @classmethod
    def execute(cls, model, qkv_fusion: bool, channels_last: bool, attention: str, compile: str,
                backend: str, mode: str, dynamic: str, fullgraph: bool, vae_slicing: bool = False,
                vae_tiling: bool = False, strict_recompiles: bool = False, compile_cache: str = "") -> io.NodeOutput:
        if pipeline_paths.is_pipeline(model):
            return pipeline_paths.optimize(model, qkv_fusion=qkv_fusion, channels_last=channels_last,
                                           attention=attention, compile=compile, backend=backend, mode=mode,
                                           dynamic=dynamic, fullgraph=fullgraph, vae_slicing=vae_slicing,
                                           vae_tiling=vae_tiling, strict_recompiles=strict_recompiles,
                                           compile_cache=compile_cache)
        m = model.clone()
        lines: list[str] = []
        device = comfy.model_management.get_torch_device()
        dtype = m.model.get_dtype()

        if attention != "comfy":
            sdpa.check_sdpa_backend(attention, device=device, dtype=dtype)  # clear error if unusable here
            mp.set_attention(m, attention)
            lines.append(f"attention: PyTorch SDPA, backend {attention} on {device}")
        elif compile != "off":
            mp.keep_comfy_attention(m)
            lines.append("attention: ComfyUI default (kept explicitly, so compiled graphs guard on it)")
        else:
            lines.append("attention: ComfyUI default (not pinned)")

        if qkv_fusion:
            n = mp.add_qkv_fusion(m)
            lines.append(f"qkv_fusion: {n} attention modules fused" if n else
                         "qkv_fusion: nothing to fuse (this architecture has no separate q/k/v projections)")
        if channels_last:
            mp.add_channels_last(m)
            lines.append("channels_last: conv weights converted during sampling, restored after")

        if compile != "off":
            options = mp.compile_options(backend, mode, dynamic, fullgraph)
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
            cache, cache_line = mp.open_compile_cache(backend, compile_cache)
            mp.add_compile(m, record, compile, cache, strict=strict_recompiles)
            lines.append(cache_line)
            if attention == "comfy":
                lines.append("WARNING: compiling with ComfyUI's own attention (sub_quad on CPU) graph-breaks and "
                             "recompiles often (measured: 15 graphs, 9 recompiles in 4 steps); pick an SDPA backend")
            lines.append(f"  {record.options}; {'new' if created else 'reused'} compile record "
                         f"({record.status}); compiles lazily on the first run or in Warmup")
            if strict_recompiles:
                lines.append("strict_recompiles: a recompile after warm-up fails the run, with its reason")
            if not created:  # what this model has compiled so far (recompiles with reasons, warnings)
                lines.append(record.as_text())
        report = "\n".join(lines)
        mp.steadfast_options(m)["optimize_report"] = report
        return io.NodeOutput(m, report, ui=ui.PreviewText(report))
