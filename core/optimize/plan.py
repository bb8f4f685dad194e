"""One plan type for both optimize paths: what to apply (:class:`OptimizeOptions`), in which order (:class:`Step`,
:func:`run_steps`), and what each step did (:class:`StepReport`, :class:`OptimizeReport`).

The MODEL path (Optimize Model: ``nodes/optimize_node.py`` over ``nodes/patches``) and the diffusers path
(:func:`core.pipelines.optimize.optimize_pipeline`) both validate an :class:`OptimizeOptions`, then run an ordered
list of :class:`Step` through :func:`run_steps`, each step returning a :class:`StepReport`. The compile settings are
held whole (:class:`core.compile.options.CompileOptions`) next to the ``scope`` they apply to
(:data:`core.compile.options.COMPILE_SCOPES`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..compile.options import COMPILE_SCOPES, CompileOptions

__all__ = ["OptimizeOptions", "Step", "StepReport", "OptimizeReport", "run_steps"]

#: The fields every path has, in the order (and with the names) :meth:`OptimizeOptions.as_dict` has always written
#: them (pipeline run records: ``optimize.options``); ``compile`` there is the scope.
_COMPILE_FIELDS = ("backend", "mode", "dynamic", "fullgraph")


@dataclass(frozen=True)
class OptimizeOptions:
    """Optimizations for a model or a diffusers pipeline; every default is "off" (the eager baseline).

    Attributes:
        qkv_fusion: fused q/k/v projections. Pipelines: diffusers ``fuse_qkv_projections()`` on the denoiser (and on
            the VAE when ``qkv_fusion_vae``); diffusers keeps the old ``to_q/to_k/to_v`` layers, so parameters grow
            (reported as ``params_before``/``params_after``). MODELs: zero-copy fusion (``nodes/patches/qkv.py``).
        qkv_fusion_vae: pipelines only: also fuse the VAE's attention when ``qkv_fusion`` (only VAEs that have the
            method).
        channels_last: channels_last conv weights (pipelines: denoiser and VAE; MODELs: during sampling only).
        attention: "auto" (torch's own SDPA dispatch), a torch SDPA backend ("math", "flash",
            "efficient", "cudnn"), for pipelines a diffusers attention-backend name (``diffusers.models.
            attention_dispatch.AttentionBackendName``, e.g. "native", "_native_math", "flex"), for MODELs
            "comfy" (ComfyUI's own attention).
        vae_slicing / vae_tiling: pipelines only: ``vae.enable_slicing()`` / ``vae.enable_tiling()``.
        scope: where ``compile`` applies, one of :data:`~..compile.options.COMPILE_SCOPES`: "off", "regional"
            (pipelines: diffusers ``compile_repeated_blocks`` on the denoiser when it declares ``_repeated_blocks``,
            otherwise a full compile, reported as such; MODELs: the blocks :func:`~..compile.blocks.choose_blocks`
            finds) or "full".
        compile: the ``torch.compile`` settings, held whole (:class:`~..compile.options.CompileOptions`).
        precision: MODELs only: compute dtype name (``core.optimize.precision.PRECISIONS``; "model" = as loaded).
        quantize: MODELs only: torchao mode (``core.optimize.quantize.MODES``) or "off".
        inductor_preset: the name of the preset whose inductor config is in ``compile.options`` ("none": none).
        strict_recompiles: a recompile after warm-up fails the run.
        compile_cache: name of the persistent compile cache ("" = default, "off" = none).

    Raises:
        ValueError: unknown ``scope``, an empty ``attention`` or ``compile.backend``.
        TypeError: ``compile`` is not a :class:`~..compile.options.CompileOptions`.
    """

    qkv_fusion: bool = False
    qkv_fusion_vae: bool = True
    channels_last: bool = False
    attention: str = "auto"
    vae_slicing: bool = False
    vae_tiling: bool = False
    scope: str = "off"
    compile: CompileOptions = field(default_factory=CompileOptions)
    precision: str = "model"
    quantize: str = "off"
    inductor_preset: str = "none"
    strict_recompiles: bool = False
    compile_cache: str = ""

    def __post_init__(self) -> None:
        if self.scope not in COMPILE_SCOPES:
            raise ValueError(f"compile must be one of {', '.join(COMPILE_SCOPES)}, got {self.scope!r}")
        if not isinstance(self.compile, CompileOptions):
            raise TypeError(f"compile must be a CompileOptions, got {type(self.compile).__name__}")
        if not isinstance(self.attention, str) or not self.attention.strip():
            raise ValueError(f"attention must be a backend name, got {self.attention!r}")
        if not self.compile.backend:
            raise ValueError("backend must be a torch.compile backend name")

    def is_baseline(self) -> bool:
        """True when nothing is switched on (the eager reference)."""
        return (
            not self.qkv_fusion
            and not self.channels_last
            and self.attention == "auto"
            and not self.vae_slicing
            and not self.vae_tiling
            and self.scope == "off"
            and self.precision == "model"
            and self.quantize == "off"
        )

    def merged(self, other: OptimizeOptions) -> OptimizeOptions:
        """Options with every switch that is on in ``self`` or ``other`` (``other`` wins for names/compile; the
        compile settings merge field by field)."""
        base = OptimizeOptions()
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for f in dataclasses.fields(other):
            value = getattr(other, f.name)
            if f.name == "compile":
                default = CompileOptions()
                values["compile"] = dataclasses.replace(
                    self.compile,
                    **{
                        c.name: getattr(value, c.name)
                        for c in dataclasses.fields(value)
                        if getattr(value, c.name) != getattr(default, c.name)
                    },
                )
            elif value != getattr(base, f.name):
                values[f.name] = value
        return OptimizeOptions(**values)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict: the pipeline fields as they have always been written (``compile`` is the scope,
        then ``backend``/``mode``/``dynamic``/``fullgraph`` of :attr:`compile`), then any other setting (MODEL-only
        fields, other compile settings) only where it is not the default."""
        out: dict[str, Any] = {
            name: getattr(self, name)
            for name in ("qkv_fusion", "qkv_fusion_vae", "channels_last", "attention", "vae_slicing", "vae_tiling")
        }
        out["compile"] = self.scope
        out.update({name: getattr(self.compile, name) for name in _COMPILE_FIELDS})
        default, compile_default = OptimizeOptions(), CompileOptions()
        for name in ("precision", "quantize", "inductor_preset", "strict_recompiles", "compile_cache"):
            if getattr(self, name) != getattr(default, name):
                out[name] = getattr(self, name)
        extra = {
            k: v
            for k, v in self.compile.as_dict().items()
            if k not in _COMPILE_FIELDS and v != getattr(compile_default, k)
        }
        if extra:
            out["compile_options"] = extra
        return out


@dataclass(frozen=True)
class Step:
    """One entry of an ordered plan: the step ``name``, whether the options ask for it (``wanted``), and ``run``,
    which applies it and returns its :class:`StepReport`."""

    name: str
    wanted: bool
    run: Callable[[], StepReport]


def run_steps(steps: Iterable[Step], into: list[StepReport]) -> list[StepReport]:
    """Run the wanted ``steps`` in order, timing each (``StepReport.seconds``), appending each report to ``into`` as
    soon as its step returns (so after a failing step, ``into`` holds the steps done so far).

    Args:
        steps: the plan, in the order to apply it.
        into: the list to append to (e.g. :attr:`OptimizeReport.steps`).
    Returns:
        ``into``.
    Raises:
        whatever a step raises; later steps do not run.
    """
    for step in steps:
        if not step.wanted:
            continue
        t0 = time.perf_counter()
        report = step.run()
        report.seconds = time.perf_counter() - t0
        into.append(report)
    return into


@dataclass
class StepReport:
    """One optimization step: whether it was applied, to which components, and what it measured.

    ``step``: "qkv_fusion", "channels_last", "attention", "vae_slicing", "vae_tiling", "compile" (both paths),
    "precision", "quantize" (MODELs), or a note of the plan itself (MODELs: "dynamic_vram", "inductor_preset").
    ``modules``: pipeline component names it was applied to (e.g. ``["unet", "vae"]``), or for a MODEL the module
    paths under ``diffusion_model`` (``["diffusion_model"]`` for the whole model).
    ``details``: step-specific numbers (parameter counts, converted weights, compiled block paths ...).
    ``note``: why something was skipped or fell back. ``seconds``: wall time of the step itself
    (for ``compile`` only the set-up: compilation happens lazily at the first call).
    ``lines``: the step's lines in a node's report, when the step words them itself (MODEL steps); empty for
    pipeline steps, whose line :meth:`as_text` composes. Presentation only: not in :meth:`as_dict`.
    """

    step: str
    applied: bool
    modules: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    seconds: float = 0.0
    lines: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict (without :attr:`lines`)."""
        out = dataclasses.asdict(self)
        del out["lines"]
        return out

    def as_text(self) -> str:
        """The step's :attr:`lines`, one per line, when it has any; else one composed line."""
        if self.lines:
            return "\n".join(self.lines)
        where = f" on {', '.join(self.modules)}" if self.modules else ""
        head = f"{self.step}: {'applied' if self.applied else 'not applied'}{where}"
        extra = _summary(self)
        return head + (f" ({extra})" if extra else "") + (f" - {self.note}" if self.note else "")


def _summary(step: StepReport) -> str:
    d = step.details
    if step.step == "qkv_fusion":
        return "; ".join(
            f"{m}: params {v['params_before']:,} -> {v['params_after']:,} (+{v['growth_pct']:.1f}%)"
            for m, v in d.get("components", {}).items()
        )
    if step.step == "channels_last":
        return ", ".join(f"{m}: {n} weights" for m, n in d.get("converted", {}).items())
    if step.step == "attention":
        parts = []
        if d.get("diffusers_backend"):
            parts.append(f"diffusers backend {d['diffusers_backend']} on {d.get('dispatch_modules', 0)} modules")
        if d.get("sdpa_context"):
            parts.append(f"torch SDPA '{d['sdpa_context']}' around each call")
        return ", ".join(parts)
    if step.step == "compile":
        return f"{d.get('kind', '')}, {d.get('n_blocks', 0)} block(s), backend {d.get('backend')}" if d else ""
    return ""


@dataclass
class OptimizeReport:
    """Result of one optimize plan (:func:`core.pipelines.optimize.optimize_pipeline`), in the order the steps ran.

    ``pipeline``: the pipeline's class name. ``denoiser``: component name of the denoiser ("unet" /
    "transformer"). ``params_before`` /
    ``params_after``: parameter counts per ``nn.Module`` component around all steps.
    """

    options: OptimizeOptions
    pipeline: str
    denoiser: str
    steps: list[StepReport] = field(default_factory=list)
    params_before: dict[str, int] = field(default_factory=dict)
    params_after: dict[str, int] = field(default_factory=dict)

    def step(self, name: str) -> StepReport | None:
        """The report of step ``name``, or None when it was not requested."""
        return next((s for s in self.steps if s.step == name), None)

    @property
    def applied(self) -> list[str]:
        """Names of the steps that were applied, in order."""
        return [s.step for s in self.steps if s.applied]

    def fingerprint_fields(self) -> dict[str, Any]:
        """Settings that change output bits, for :func:`~..fingerprint.environment_fingerprint` extras."""
        o = self.options
        comp = self.step("compile")
        return {
            "pipeline_qkv_fusion": o.qkv_fusion,
            "pipeline_channels_last": o.channels_last,
            "pipeline_attention": o.attention,
            "pipeline_vae_slicing": o.vae_slicing,
            "pipeline_vae_tiling": o.vae_tiling,
            "pipeline_compile": (comp.details.get("kind") if comp and comp.applied else "off"),
            "pipeline_compile_backend": o.compile.backend if o.scope != "off" else None,
        }

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict."""
        return {
            "options": self.options.as_dict(),
            "pipeline": self.pipeline,
            "denoiser": self.denoiser,
            "applied": self.applied,
            "steps": [s.as_dict() for s in self.steps],
            "params_before": dict(self.params_before),
            "params_after": dict(self.params_after),
        }

    def as_text(self) -> str:
        """One line per step (or "baseline: nothing applied")."""
        if not self.steps:
            return f"{self.pipeline}: baseline, nothing applied"
        return "\n".join(s.as_text() for s in self.steps)
