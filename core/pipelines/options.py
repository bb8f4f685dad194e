"""What :func:`~.optimize.optimize_pipeline` may apply, and the report of what it did."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..compile.swap import CompileOptions

__all__ = ["COMPILE_MODES", "PipelineOptions", "StepReport", "OptimizeReport"]

COMPILE_MODES = ("off", "regional", "full")


@dataclass(frozen=True)
class PipelineOptions:
    """Optimizations for a diffusers pipeline; every default is "off" (the eager baseline).

    Attributes:
        qkv_fusion: diffusers ``fuse_qkv_projections()`` on the denoiser (and on the VAE when
            ``qkv_fusion_vae``). diffusers keeps the old ``to_q/to_k/to_v`` layers, so parameters grow
            (reported as ``params_before``/``params_after``).
        qkv_fusion_vae: also fuse the VAE's attention when ``qkv_fusion`` (only VAEs that have the method).
        channels_last: channels_last conv weights on the denoiser and the VAE.
        attention: "auto" (torch's own SDPA dispatch), a torch SDPA backend ("math", "flash",
            "efficient", "cudnn"), or a diffusers attention-backend name (``diffusers.models.
            attention_dispatch.AttentionBackendName``, e.g. "native", "_native_math", "flex").
        vae_slicing / vae_tiling: ``vae.enable_slicing()`` / ``vae.enable_tiling()``.
        compile: "off", "regional" (diffusers ``compile_repeated_blocks`` on the denoiser when it
            declares ``_repeated_blocks``; otherwise a full compile, reported as such) or "full".
        backend / mode / dynamic / fullgraph: ``torch.compile`` arguments (see :class:`CompileOptions`).

    Raises:
        ValueError: unknown ``compile`` mode or an empty ``attention``/``backend``.
    """

    qkv_fusion: bool = False
    qkv_fusion_vae: bool = True
    channels_last: bool = False
    attention: str = "auto"
    vae_slicing: bool = False
    vae_tiling: bool = False
    compile: str = "off"
    backend: str = "inductor"
    mode: str | None = None
    dynamic: bool | None = None
    fullgraph: bool = False

    def __post_init__(self) -> None:
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        if not isinstance(self.attention, str) or not self.attention.strip():
            raise ValueError(f"attention must be a backend name, got {self.attention!r}")
        if not self.backend:
            raise ValueError("backend must be a torch.compile backend name")

    def compile_options(self) -> CompileOptions:
        """The ``torch.compile`` settings as a :class:`~..compile.CompileOptions`."""
        return CompileOptions(backend=self.backend, mode=self.mode, dynamic=self.dynamic,
                              fullgraph=self.fullgraph)

    def is_baseline(self) -> bool:
        """True when nothing is switched on (the eager reference)."""
        return (not self.qkv_fusion and not self.channels_last and self.attention == "auto"
                and not self.vae_slicing and not self.vae_tiling and self.compile == "off")

    def merged(self, other: PipelineOptions) -> PipelineOptions:
        """Options with every switch that is on in ``self`` or ``other`` (``other`` wins for names/compile)."""
        base = PipelineOptions()
        values = dataclasses.asdict(self)
        for key, value in dataclasses.asdict(other).items():
            if value != getattr(base, key):
                values[key] = value
        return PipelineOptions(**values)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict of all fields."""
        return dataclasses.asdict(self)


@dataclass
class StepReport:
    """One optimization step: whether it was applied, to which components, and what it measured.

    ``step``: "qkv_fusion", "channels_last", "attention", "vae_slicing", "vae_tiling" or "compile".
    ``modules``: pipeline component names it was applied to (e.g. ``["unet", "vae"]``).
    ``details``: step-specific numbers (parameter counts, converted weights, compiled block paths ...).
    ``note``: why something was skipped or fell back. ``seconds``: wall time of the step itself
    (for ``compile`` only the set-up: compilation happens lazily at the first call).
    """

    step: str
    applied: bool
    modules: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict."""
        return dataclasses.asdict(self)

    def as_text(self) -> str:
        """One line."""
        where = f" on {', '.join(self.modules)}" if self.modules else ""
        head = f"{self.step}: {'applied' if self.applied else 'not applied'}{where}"
        extra = _summary(self)
        return head + (f" ({extra})" if extra else "") + (f" - {self.note}" if self.note else "")


def _summary(step: StepReport) -> str:
    d = step.details
    if step.step == "qkv_fusion":
        return "; ".join(f"{m}: params {v['params_before']:,} -> {v['params_after']:,} (+{v['growth_pct']:.1f}%)"
                         for m, v in d.get("components", {}).items())
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
        return (f"{d.get('kind', '')}, {d.get('n_blocks', 0)} block(s), backend {d.get('backend')}"
                if d else "")
    return ""


@dataclass
class OptimizeReport:
    """Result of :func:`~.optimize.optimize_pipeline`, in the order the steps ran.

    ``denoiser``: component name of the denoiser ("unet" / "transformer"). ``params_before`` /
    ``params_after``: parameter counts per ``nn.Module`` component around all steps.
    """

    options: PipelineOptions
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
        """Settings that change output bits, for :func:`~..record.environment.environment_fingerprint` extras."""
        o = self.options
        comp = self.step("compile")
        return {
            "pipeline_qkv_fusion": o.qkv_fusion, "pipeline_channels_last": o.channels_last,
            "pipeline_attention": o.attention, "pipeline_vae_slicing": o.vae_slicing,
            "pipeline_vae_tiling": o.vae_tiling,
            "pipeline_compile": (comp.details.get("kind") if comp and comp.applied else "off"),
            "pipeline_compile_backend": o.backend if o.compile != "off" else None,
        }

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict."""
        return {"options": self.options.as_dict(), "pipeline": self.pipeline, "denoiser": self.denoiser,
                "applied": self.applied, "steps": [s.as_dict() for s in self.steps],
                "params_before": dict(self.params_before), "params_after": dict(self.params_after)}

    def as_text(self) -> str:
        """One line per step (or "baseline: nothing applied")."""
        if not self.steps:
            return f"{self.pipeline}: baseline, nothing applied"
        return "\n".join(s.as_text() for s in self.steps)
