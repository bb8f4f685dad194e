"""The verification suite behind ``steadfast verify``: self-consistency, parity, a grid and a benchmark.

For a diffusers pipeline folder (or an embedded tiny pipeline, :mod:`.tiny`), and a list of optimization
configurations (``baseline``, ``qkv``, ``channels_last``, ``attn-math``, ``compile-regional`` ... and
``+``-combinations such as ``qkv+channels_last``):

a. **self-consistency**: each configuration generates the same image ``runs`` times; all SHA-256 digests
   (:func:`~.hashing.hash_image`, raw float32 and as-saved uint8) must be equal;
b. **parity** of each configuration against ``baseline``: bit-equal, else max |d| and % pixels
   (:func:`~.compare.compare`), next to what was *expected* ("bit-equal", "differs" or "may differ",
   with the reason; compiled vs eager is not expected to be bit-equal);
c. a labelled comparison grid PNG (images, and where they differ a heat map);
d. an interleaved benchmark: warm-up excluded, then ``rounds`` rounds of A B C ..., medians and ratios
   against the baseline (interleaving spreads machine-load drift over all configurations).

Every configuration gets its own freshly loaded pipeline (optimizations change pipelines in place), and
all stay loaded for the interleaved benchmark: memory grows with the number of configurations.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..core.compile.options import CompileOptions
from ..core.determinism.policy import DeterminismPolicy
from ..core.pipelines import (
    OptimizeOptions,
    attention_names,
    compile_record,
    generate,
    load_pipeline,
    optimize_pipeline,
    warmup,
)
from ..core.pipelines.attention import TORCH_TO_DIFFUSERS
from ..core.record.compare import compare
from ..core.record.environment import environment_fingerprint, fingerprint_digest
from ..core.record.hashing import hash_image
from .verify_render import format_table, write_grid

__all__ = [
    "SCHEMA",
    "DEFAULT_CONFIGS",
    "VerifyConfig",
    "VerifySettings",
    "VerifyResult",
    "config_names",
    "parse_configs",
    "run_verify",
]

SCHEMA = "steadfast-verify/1"
DEFAULT_CONFIGS = "baseline,qkv,channels_last,attn-math,vae-slicing,vae-tiling,compile-regional"
_BASE_NAMES = ("baseline", "qkv", "channels_last", "vae-slicing", "vae-tiling", "compile-regional", "compile-full")


def config_names() -> list[str]:
    """Every single configuration name (combine them with ``+``): the fixed ones and ``attn-<backend>``."""
    return list(_BASE_NAMES) + [f"attn-{n}" for n in attention_names()]


def _options_for(part: str, backend: str, mode: str | None) -> OptimizeOptions:
    fixed = {
        "baseline": OptimizeOptions(),
        "qkv": OptimizeOptions(qkv_fusion=True),
        "channels_last": OptimizeOptions(channels_last=True),
        "vae-slicing": OptimizeOptions(vae_slicing=True),
        "vae-tiling": OptimizeOptions(vae_tiling=True),
        "compile-regional": OptimizeOptions(scope="regional", compile=CompileOptions(backend=backend, mode=mode)),
        "compile-full": OptimizeOptions(scope="full", compile=CompileOptions(backend=backend, mode=mode)),
    }
    if part in fixed:
        return fixed[part]
    if part.startswith("attn-") and part[5:] in attention_names():
        return OptimizeOptions(attention=part[5:])
    raise ValueError(
        f"unknown configuration {part!r}; known: {', '.join(_BASE_NAMES)}, attn-<backend> "
        f"(backends: {', '.join(attention_names())}), and '+' combinations"
    )


def _expect_part(part: str, dtype: str, device: str, batch: int, backend: str) -> tuple[str, str]:
    """(expectation, reason) for one configuration part versus the eager baseline."""
    cpu = str(device).startswith("cpu")
    if part == "baseline":
        return "reference", "eager, nothing applied"
    if part == "qkv":
        if dtype == "fp32" and cpu:
            return "bit-equal", "fused Linear(K,3K) rows equal 3x Linear(K,K) bit for bit in fp32 on CPU (measured)"
        return "may differ", "fused and separate matmuls may take different kernels (1-ulp bf16 diffs at K>=1280)"
    if part == "channels_last":
        return "differs", "conv and GroupNorm take other kernels for channels_last tensors"
    if part.startswith("attn-"):
        name = part[5:]
        torch_name = {v: k for k, v in TORCH_TO_DIFFUSERS.items()}.get(name, name)
        if torch_name == "auto":
            return "bit-equal", "torch's default SDPA dispatch, same as the baseline"
        if cpu and torch_name == "flash":
            return "bit-equal", "on CPU torch's default SDPA dispatch already picks the flash kernel"
        if cpu and torch_name == "math":
            return "differs", "math SDPA vs the flash kernel the CPU default picks"
        return "may differ", f"{name} may or may not be what the default dispatch picks here"
    if part == "vae-slicing":
        if batch == 1:
            return "bit-equal", "slicing decodes one image at a time; with batch 1 that is the same call"
        return "may differ", "per-image decode vs batched decode (CPU kernels are not batch-invariant)"
    if part == "vae-tiling":
        return "may differ", "tiles are decoded separately and blended once the latent exceeds the tile size"
    if part.startswith("compile-"):
        if backend == "eager":
            return "bit-equal", "Dynamo's eager backend replays the captured torch ops unchanged"
        if backend == "aot_eager":
            return "may differ", "AOTAutograd decompositions may reorder arithmetic"
        return "differs", f"{backend} generates its own fused kernels (compiled vs eager is not bit-equal)"
    return "may differ", "no expectation known"


_RANK = {"reference": 0, "bit-equal": 1, "may differ": 2, "differs": 3}


@dataclass(frozen=True)
class VerifyConfig:
    """One configuration: ``name`` (e.g. "qkv+compile-regional"), its merged options and the expectation
    ("reference" | "bit-equal" | "may differ" | "differs") with its ``reason``."""

    name: str
    options: OptimizeOptions
    expectation: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict."""
        return {
            "name": self.name,
            "options": self.options.as_dict(),
            "expectation": self.expectation,
            "reason": self.reason,
        }


def parse_configs(
    spec: str | Sequence[str],
    *,
    dtype: str = "fp32",
    device: str = "cpu",
    batch: int = 1,
    compile_backend: str = "inductor",
    compile_mode: str | None = None,
) -> list[VerifyConfig]:
    """Parse "baseline,qkv,attn-math,qkv+channels_last" into configurations; "baseline" is put first
    (added when missing, since parity is measured against it). Duplicates are dropped.

    Raises:
        ValueError: an unknown name or an empty list.
    """
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s and s.strip()]
    if not names:
        raise ValueError("no configurations given")
    out: list[VerifyConfig] = []
    seen = set()
    for name in ["baseline"] + [n for n in names if n != "baseline"]:
        if name in seen:
            continue
        seen.add(name)
        opts = OptimizeOptions()
        parts = [p.strip() for p in name.split("+")]
        exps = []
        for part in parts:
            opts = opts.merged(_options_for(part, compile_backend, compile_mode))
            exps.append(_expect_part(part, dtype, device, batch, compile_backend))
        worst = max(exps, key=lambda e: _RANK[e[0]])
        reason = "; ".join(f"{p}: {r}" for p, (_, r) in zip(parts, exps)) if len(parts) > 1 else worst[1]
        out.append(VerifyConfig(name, opts, worst[0], reason))
    return out


@dataclass
class VerifySettings:
    """Inputs of :func:`run_verify`. Exactly one of ``pipeline_dir`` / ``tiny`` ("sd" | "flux").

    ``size``: ``(width, height)`` in pixels (None: 64x64 for tiny pipelines, else the pipeline default).
    ``runs``: generations per configuration for self-consistency (>= 2). ``rounds``: benchmark rounds
    (0 skips the benchmark). ``out_dir``: where ``verify_report.json`` and ``verify_grid.png`` go.
    ``policy``: run every generation under this :class:`~.determinism_policy.DeterminismPolicy` (None: as is).
    """

    pipeline_dir: str | Path | None = None
    tiny: str | None = None
    configs: str | Sequence[str] = DEFAULT_CONFIGS
    runs: int = 3
    rounds: int = 3
    steps: int = 4
    size: tuple[int, int] | None = None
    seed: int = 0
    batch: int = 1
    prompt: str = "a photo of a red fox in the snow"
    negative_prompt: str = ""
    guidance: float | None = None
    dtype: str = "fp32"
    device: str = "cpu"
    compile_backend: str = "inductor"
    compile_mode: str | None = None
    out_dir: str | Path = "steadfast-verify"
    progress: bool = True
    extra: dict[str, Any] | None = None
    policy: DeterminismPolicy | None = None

    def validate(self) -> None:
        """Raise ``ValueError`` for inconsistent settings."""
        if (self.pipeline_dir is None) == (self.tiny is None):
            raise ValueError("give either a pipeline folder or a tiny pipeline kind, not both / neither")
        if self.runs < 2:
            raise ValueError(f"runs must be >= 2 to check self-consistency, got {self.runs}")
        if self.rounds < 0 or self.steps < 1 or self.batch < 1:
            raise ValueError("rounds must be >= 0, steps and batch >= 1")


@dataclass
class VerifyResult:
    """Outcome of :func:`run_verify`: the JSON-safe ``report`` (also written to ``report_path``), the grid
    PNG path, and ``exit_code`` (0 when every configuration that ran was self-consistent and the
    baseline ran, else 1)."""

    report: dict[str, Any]
    report_path: Path
    grid_path: Path | None
    exit_code: int
    images: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """Self-consistency held."""
        return self.exit_code == 0

    def table(self) -> str:
        """The human-readable summary table."""
        return format_table(self.report)


class _Progress:
    """tqdm when available and wanted, else nothing (a bar to stderr)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, file=sys.stderr, unit="step", dynamic_ncols=True)
            except ImportError:
                self._bar = None

    def step(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(text[:40])
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _digests(images: torch.Tensor) -> tuple[str, str]:
    return hash_image(images, raw=True), hash_image(images)


def run_verify(settings: VerifySettings) -> VerifyResult:
    """Run the suite (see the module docstring) and write ``verify_report.json`` + ``verify_grid.png``.

    A configuration that fails to load/optimize/run is reported with its error and skipped.
    Raises:
        ValueError: bad settings or configuration names. PipelineLoadError: the folder cannot be loaded
        (for the baseline). FileExistsError never: ``out_dir`` is created or reused.
    """
    settings.validate()
    t_start = time.perf_counter()
    configs = parse_configs(
        settings.configs,
        dtype=settings.dtype,
        device=settings.device,
        batch=settings.batch,
        compile_backend=settings.compile_backend,
        compile_mode=settings.compile_mode,
    )
    out_dir = Path(settings.out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="steadfast-tiny-") as tmp:
        if settings.tiny is not None:
            from .tiny_pipelines import build_tiny_pipeline

            folder = build_tiny_pipeline(settings.tiny, Path(tmp) / settings.tiny, seed=0)
            source = {"kind": "tiny", "tiny": settings.tiny, "path": None}
            size = settings.size or (64, 64)
        else:
            folder = Path(settings.pipeline_dir).expanduser()
            source = {"kind": "folder", "path": str(folder.resolve())}
            size = settings.size
        return _run(settings, configs, folder, source, size, out_dir, t_start)


def _run(
    s: VerifySettings,
    configs: list[VerifyConfig],
    folder: Path,
    source: dict[str, Any],
    size: tuple[int, int] | None,
    out_dir: Path,
    t_start: float,
) -> VerifyResult:
    width, height = size if size is not None else (None, None)
    gen_kw = dict(
        steps=s.steps,
        guidance=s.guidance,
        width=width,
        height=height,
        seed=s.seed,
        batch=s.batch,
        extra=s.extra,
        policy=s.policy,
    )
    progress = _Progress(len(configs) * (2 + s.runs) + s.rounds * len(configs), s.progress)
    entries: list[dict[str, Any]] = []
    pipes: dict[str, Any] = {}
    images: dict[str, torch.Tensor] = {}
    try:
        for cfg in configs:
            entry: dict[str, Any] = {**cfg.as_dict(), "error": None}
            entries.append(entry)
            try:
                progress.step(f"load {cfg.name}")
                pipe = load_pipeline(folder, dtype=s.dtype, device=s.device)
                if source.get("pipeline") is None:
                    source["pipeline"] = type(pipe).__name__
                entry["optimize"] = optimize_pipeline(pipe, cfg.options).as_dict()
                progress.step(f"warm-up {cfg.name}")
                entry["warmup"] = warmup(
                    pipe, width, height, s.batch, steps=s.steps, guidance=s.guidance, extra=s.extra, policy=s.policy
                ).as_dict()
                raw, saved = [], []
                for i in range(s.runs):
                    progress.step(f"run {i + 1}/{s.runs} {cfg.name}")
                    img = generate(pipe, s.prompt, s.negative_prompt, **gen_kw)
                    r, d = _digests(img)
                    raw.append(r)
                    saved.append(d)
                    if i == 0:
                        images[cfg.name] = img
            except Exception as e:  # noqa: BLE001 - reported per configuration
                if cfg.name == "baseline":
                    raise
                entry["error"] = f"{type(e).__name__}: {e}"
                continue
            pipes[cfg.name] = pipe
            entry["digests"] = {"raw_float32": raw, "saved_uint8": saved}
            entry["self_consistent"] = len(set(raw)) == 1 and len(set(saved)) == 1
            _refine_tiling(entry, cfg, width)
        _parity(entries, images)
        timings = _benchmark(pipes, s, gen_kw, progress)
    finally:
        progress.close()
    for entry in entries:
        rec = compile_record(pipes[entry["name"]]) if entry["name"] in pipes else None
        entry["compile"] = rec.summary() if rec is not None else None
        entry["timing"] = timings.get(entry["name"])
    ran = [e for e in entries if e["error"] is None]
    ok = bool(ran) and ran[0]["name"] == "baseline" and all(e["self_consistent"] for e in ran)
    env = environment_fingerprint(verify_dtype=s.dtype, verify_device=s.device)
    report = {
        "schema": SCHEMA,
        "ok": ok,
        "exit_code": 0 if ok else 1,
        "source": source,
        "settings": {
            "configs": [c.name for c in configs],
            "runs": s.runs,
            "rounds": s.rounds,
            "steps": s.steps,
            "width": width,
            "height": height,
            "seed": s.seed,
            "batch": s.batch,
            "prompt": s.prompt,
            "negative_prompt": s.negative_prompt,
            "guidance": s.guidance,
            "dtype": s.dtype,
            "device": s.device,
            "compile_backend": s.compile_backend,
            "compile_mode": s.compile_mode,
            "extra": s.extra,
            "policy": s.policy.as_dict() if s.policy is not None else None,
        },
        "self_consistency": {"ok": ok, "per_config": {e["name"]: e.get("self_consistent") for e in entries}},
        "configs": entries,
        "environment": env,
        "environment_digest": fingerprint_digest(env),
    }
    grid = write_grid(entries, images, out_dir / "verify_grid.png") if images else None
    report["grid"] = str(grid) if grid is not None else None
    report_path = out_dir / "verify_report.json"
    report["report"] = str(report_path)
    report["seconds"] = round(time.perf_counter() - t_start, 3)
    report_path.write_text(json.dumps(report, indent=1, allow_nan=False), encoding="utf-8")
    return VerifyResult(report, report_path, grid, report["exit_code"], images)


def _refine_tiling(entry: dict[str, Any], cfg: VerifyConfig, width: int | None) -> None:
    """Tiling only engages when the image exceeds the VAE's tile size: make the expectation exact."""
    if not cfg.options.vae_tiling or "+" in cfg.name:
        return
    step = next((st for st in entry["optimize"]["steps"] if st["step"] == "vae_tiling"), None)
    tile = (step or {}).get("details", {}).get("tile_sample_min_size")
    if isinstance(tile, int) and width is not None:
        if width > tile:
            entry["expectation"], entry["reason"] = (
                "differs",
                (f"image {width} px > VAE tile {tile} px: tiles are decoded separately and blended"),
            )
        else:
            entry["expectation"], entry["reason"] = (
                "bit-equal",
                (f"image {width} px <= VAE tile {tile} px: tiling does not engage"),
            )


def _parity(entries: list[dict[str, Any]], images: dict[str, torch.Tensor]) -> None:
    base = images.get("baseline")
    for e in entries:
        if e["error"] is not None or base is None:
            e["parity"], e["status"] = None, "error" if e["error"] else "no baseline"
            continue
        if e["name"] == "baseline":
            e["parity"], e["status"] = None, "reference"
            continue
        rep = compare(base, images[e["name"]], kind="image")
        parity = rep.as_dict()
        parity["saved_identical"] = hash_image(base) == hash_image(images[e["name"]])
        e["parity"] = parity
        exp = e["expectation"]
        if exp == "bit-equal":
            e["status"] = "as expected" if rep.identical else "UNEXPECTED: differs"
        elif exp == "differs":
            e["status"] = "as expected" if not rep.identical else "unexpectedly bit-equal"
        else:
            e["status"] = "measured"


def _benchmark(
    pipes: dict[str, Any], s: VerifySettings, gen_kw: dict[str, Any], progress: _Progress
) -> dict[str, dict[str, Any]]:
    samples: dict[str, list[float]] = {name: [] for name in pipes}
    for r in range(s.rounds):
        for name, pipe in pipes.items():
            progress.step(f"bench {r + 1}/{s.rounds} {name}")
            t0 = time.perf_counter()
            generate(pipe, s.prompt, s.negative_prompt, **gen_kw)
            samples[name].append(time.perf_counter() - t0)
    if not s.rounds:
        return {}
    base = statistics.median(samples["baseline"]) if samples.get("baseline") else None
    out = {}
    for name, xs in samples.items():
        med = statistics.median(xs)
        out[name] = {
            "samples_s": [round(x, 6) for x in xs],
            "median_s": med,
            "min_s": min(xs),
            "ratio_vs_baseline": (med / base) if base else None,
            "speedup_vs_baseline": (base / med) if base and med > 0 else None,
        }
    return out
