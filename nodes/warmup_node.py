"""Steadfast Warmup: run the model once at the target size so compilation happens here, not in the timed run."""

from __future__ import annotations

import time

import torch

import comfy.model_management
import comfy.sample
import comfy.samplers
import comfy.utils
from comfy_api.v0_0_2 import io, ui

from ..core import torch_compat
from ..core.compile.registry import REGISTRY
from ..core.sizes import check_sizes, warm_targets


def _zero_conditioning(model, batch: int) -> list:
    """Neutral CONDITIONING for a warmup step, built from the model's config (zeros, shapes only).

    Raises ValueError for architectures whose conditioning shape is not known from the config; wire
    real ``positive``/``negative`` conditioning into the node for those.
    """
    cfg = getattr(model.model.model_config, "unet_config", {}) or {}
    context_dim = cfg.get("context_dim")
    if not context_dim:
        raise ValueError(
            "Warmup: cannot build conditioning for this model type from its config; "
            "connect the 'positive' and 'negative' inputs."
        )
    extra = {}
    adm = cfg.get("adm_in_channels")
    if adm:  # SDXL-style pooled output; the rest of the ADM vector is derived from width/height
        extra["pooled_output"] = torch.zeros(1, 1280)
    return [[torch.zeros(1, 77, int(context_dim)), extra]]


class SteadfastWarmup(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastWarmup",
            is_output_node=True,  # its report is shown again when ComfyUI answers from cache
            display_name="Warmup (Steadfast)",
            category="Steadfast",
            description="Runs one sampling step at the target size so torch.compile compiles here. A model already "
            "warm at this size is not run again. Shows compile seconds, graphs, recompiles and cache "
            "state.",
            inputs=[
                io.Model.Input(
                    "model", tooltip="The (optimized) MODEL to warm up. Diffusers pipelines: use Pipeline Warmup."
                ),
                io.Int.Input("width", default=512, min=16, max=16384, step=8, tooltip="Target image width in pixels."),
                io.Int.Input(
                    "height", default=512, min=16, max=16384, step=8, tooltip="Target image height in pixels."
                ),
                io.Int.Input("batch_size", default=1, min=1, max=4096, tooltip="Target batch size."),
                io.Float.Input(
                    "cfg",
                    default=8.0,
                    min=0.0,
                    max=100.0,
                    step=0.1,
                    tooltip="Use the cfg of the real run: cfg 1.0 skips the negative pass, which changes "
                    "the batch the model sees.",
                ),
                io.Conditioning.Input(
                    "positive",
                    optional=True,
                    tooltip="Optional conditioning; zeros of the model's context shape when absent.",
                ),
                io.Conditioning.Input("negative", optional=True, tooltip="Optional negative conditioning."),
                io.String.Input(
                    "sizes",
                    default="",
                    optional=True,
                    tooltip="More target sizes to warm up, e.g. '512x512, 768x512' (pixels; width x "
                    "height also used). With Optimize dynamic=true one graph serves every size; "
                    "with dynamic=auto the second size makes the graph dynamic (one recompile "
                    "here).",
                ),
            ],
            outputs=[
                io.Model.Output(display_name="MODEL", tooltip="The same model, now warm."),
                io.String.Output(display_name="report", tooltip="Compile seconds, graphs, recompiles, cache state."),
            ],
        )

    @classmethod
    def validate_inputs(cls, sizes: str = "") -> bool | str:
        # sizes only (ComfyUI marks every argument of validate_inputs as at fault when it fails)
        return check_sizes(sizes)

    @classmethod
    def execute(
        cls, model, width: int, height: int, batch_size: int, cfg: float, positive=None, negative=None, sizes: str = ""
    ) -> io.NodeOutput:
        latent_format = model.get_model_object("latent_format")
        channels = latent_format.latent_channels
        down = getattr(latent_format, "spacial_downscale_ratio", 8)
        targets = warm_targets(width, height, sizes)
        progress = _CompileProgress(len(targets), model)
        reports = []
        with torch_compat.compile_events(progress.compiled, progress.phase):
            for i, (w, h) in enumerate(targets):
                shape = (batch_size, channels, h // down, w // down)
                positive, negative, text = _warm_one(model, shape, cfg, positive, negative)
                reports.append(text)
                progress.target_done(i)
        report = "\n".join(reports)
        return io.NodeOutput(model, report, ui=ui.PreviewText(report))


class _CompileProgress:
    """The node's progress bar while it compiles: each target size gets one slot per compiled block (an upper
    bound on the graphs one warm step compiles), each slot one step per compile phase (``COMPILE_PHASES``) and one
    for the graph done. Every phase a graph's compile starts (Dynamo's trace, the backend, inductor's lowering, code
    generation, the C++ build, the guards) moves the bar within the graph's slot, a finished graph to the next slot,
    a finished target fills its share. So a long cold compile shows movement instead of 0% until the end, also
    while one graph compiles for many seconds."""

    def __init__(self, n_targets: int, model) -> None:
        record = REGISTRY.get(model.model)
        self.steps = len(torch_compat.COMPILE_PHASES) + 1  # per graph
        self.per_target = (max(1, len(record.blocks) if record is not None else 1) + 1) * self.steps
        self.total = n_targets * self.per_target
        self.graph = 0  # where the slot of the graph being compiled starts
        self.done = 0
        self.bar = comfy.utils.ProgressBar(self.total)

    def _show(self, value: int) -> None:
        target_end = (self.done // self.per_target + 1) * self.per_target
        value = min(value, target_end - 1)  # the last step of a target is its finished warm step
        if value > self.done:
            self.done = value
            self.bar.update_absolute(self.done, self.total)

    def phase(self, name: str) -> None:
        self._show(self.graph + torch_compat.COMPILE_PHASES.index(name) + 1)

    def compiled(self) -> None:
        self.graph += self.steps
        self._show(self.graph)

    def target_done(self, i: int) -> None:
        self.graph = self.done = (i + 1) * self.per_target
        self.bar.update_absolute(self.done, self.total)


def _warm_one(model, shape: tuple[int, ...], cfg: float, positive, negative) -> tuple[list, list, str]:
    """One euler step at latent ``shape`` unless the model is already warm for it; returns the
    (possibly built) conditioning and a report."""
    record = REGISTRY.get(model.model)
    if record is not None and record.is_warm_for(shape):
        return positive, negative, f"already warm for latent {list(shape)}: nothing to do\n{record.as_text()}"
    if positive is None:
        positive = _zero_conditioning(model, 1)
    if negative is None:
        negative = positive
    latent = torch.zeros(shape)
    noise = torch.zeros(shape)
    t0 = time.perf_counter()
    comfy.sample.sample(
        model, noise, 1, cfg, "euler", "normal", positive, negative, latent, denoise=1.0, disable_pbar=True, seed=0
    )
    seconds = time.perf_counter() - t0
    record = REGISTRY.get(model.model)
    if record is None:
        return (
            positive,
            negative,
            (f"warmup step at latent {list(shape)}: {seconds:.2f} s (model is not compiled by Steadfast)"),
        )
    REGISTRY.mark_warm(record, shape)
    return positive, negative, f"warmup step at latent {list(shape)}: {seconds:.2f} s\n{record.as_text()}"
