"""The run record: one typed schema for every Steadfast sampler (MODEL and diffusers pipeline), and its one builder.

A run record says what decided the output bits of one sampling run: seeds, sampler settings, the
output's hash, the environment fingerprint (:func:`core.record.environment.environment_fingerprint`) and the
compile state. Two records of the same workflow can be compared field by field; ``from_json`` reads
back what :meth:`RunRecord.as_json` wrote (the Seeded Sampler nodes' ``run_record`` output).

Both samplers build theirs here: :func:`for_model` (Seeded Sampler) and :func:`for_pipeline` (Pipeline Sampler)
gather their path's fields and share one core (seeds from :func:`core.determinism.noise.item_seeds`, the output's
digest, the running ComfyUI's facts in the fingerprint, the timing): a node only collects what ComfyUI knows.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..determinism.noise import item_seeds
from .environment import environment_fingerprint, fingerprint_digest
from .hashing import hash_image, is_sha256, tensor_digest

__all__ = ["KINDS", "OUTPUTS", "PIPELINE_SEED_MODE", "RunRecord", "for_model", "for_pipeline"]

KINDS = ("model", "pipeline")
OUTPUTS = ("latent", "image")
#: ``batch_seed_mode`` of a pipeline run: image i from its own CPU generator seeded ``seed + i``.
PIPELINE_SEED_MODE = "incremental (one CPU generator per image)"


@dataclass
class RunRecord:
    """What one sampler run did and what decided its bits.

    Attributes:
        kind: "model" (a ComfyUI MODEL sampled by Seeded Sampler) or "pipeline" (a diffusers pipeline).
        seeds: the seed of each batch item, in batch order.
        batch_seed_mode: how ``seeds`` were derived ("incremental": item i uses seed + i; "comfy":
            ComfyUI's one batch noise stream, every item listed with the base seed).
        steps / cfg / denoise: sampler settings (cfg: classifier-free guidance scale, unitless).
        sampler / scheduler: the sampling algorithm and noise schedule actually used (a pipeline samples
            with its own scheduler: ``sampler`` is its class name, ``scheduler`` "pipeline's own").
        output: "latent" (a LATENT ``[B, C, H/8, W/8]``) or "image" (an IMAGE ``[B, H, W, 3]`` float32).
        output_shape: the output tensor's shape.
        output_sha256: 64-hex SHA-256 of the output (:mod:`core.record.hashing`: latent = exact tensor bytes,
            image = the uint8 pixels SaveImage writes).
        fingerprint: the environment fingerprint; ``num_threads`` and ``flags`` as measured *while*
            sampling (Determinism Setup restores them after).
        compile: the compile state ("off", or a dict: status, graphs, recompiles with reasons, ...).
        recompiles_this_run: recompiles counted during this run (0 when not compiled).
        seconds: wall time of the sampling call (s); None when not measured.
        model: what was sampled: ``digest`` (64-hex SHA-256 over the diffusion model's weights as sampled,
            :mod:`core.record.model_identity`), ``tensors``, ``bytes``, and where known ``file`` /
            ``file_size`` (bytes).
        details: path-specific facts (MODEL: per-step noise source, QKV fusion counters; pipeline:
            prompt, source, dtype, LoRA, optimizations, fingerprint digest).

    Raises:
        ValueError: unknown ``kind``/``output``, a hash that is not 64 hex characters, or ``seeds``
            not matching the batch dimension of ``output_shape``.
    """

    kind: str
    seeds: list[int]
    batch_seed_mode: str
    steps: int
    cfg: float
    denoise: float
    sampler: str
    scheduler: str
    output: str
    output_shape: list[int]
    output_sha256: str
    fingerprint: dict[str, Any]
    compile: dict[str, Any] | str = "off"
    recompiles_this_run: int = 0
    seconds: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"run record kind must be one of {KINDS}, got {self.kind!r}")
        if self.output not in OUTPUTS:
            raise ValueError(f"run record output must be one of {OUTPUTS}, got {self.output!r}")
        h = self.output_sha256
        if not is_sha256(h):
            raise ValueError(f"output_sha256 must be 64 lowercase hex characters, got {h!r}")
        if not self.output_shape or len(self.seeds) != self.output_shape[0]:
            raise ValueError(f"{len(self.seeds)} seeds for an output of shape {self.output_shape}")

    def as_dict(self) -> dict[str, Any]:
        """Plain dict of every field (nested values as given; see :meth:`as_json` for JSON-safe text)."""
        return dataclasses.asdict(self)

    def as_json(self) -> str:
        """Indented JSON of :meth:`as_dict` (non-JSON values, e.g. dtypes, as their ``str``)."""
        return json.dumps(self.as_dict(), indent=1, default=str)

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        """The record :meth:`as_json` wrote. Raises ``ValueError`` for text that is not a JSON object
        with exactly this class's fields (naming the missing or unknown ones) or fails validation."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"run record is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise ValueError(f"run record must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        unknown, missing = sorted(set(data) - names), sorted(required - set(data))
        if unknown or missing:
            raise ValueError(f"not a Steadfast run record: missing fields {missing}, unknown fields {unknown}")
        return cls(**data)

    def summary_text(self) -> str:
        """A few lines for the node's display: hash, seeds, what decided the bits, compile state
        (recompiles with reasons, warnings, and a compile failure loudly)."""
        seeds = self.seeds
        more = " \u2026" if len(seeds) > 4 else ""  # an ellipsis; escaped, the source stays ASCII
        lines = [f"{self.output} sha256 {self.output_sha256[:16]}\u2026  seeds {seeds[:4]}{more}"]
        fp = self.fingerprint
        if self.kind == "pipeline":
            d = self.details
            lines.append(
                f"{d.get('pipeline')} ({d.get('dtype')}), scheduler {self.sampler}, "
                f"threads {fp.get('num_threads')}" + (f", {self.seconds:.2f} s" if self.seconds is not None else "")
            )
            lora = d.get("lora")
            if lora:
                events = d.get("lora_events") or []
                lines.append(f"LoRA {lora['name']}" + (f": {'; '.join(events)}" if events else ""))
        else:
            lines.append(
                f"{self.sampler}/{self.scheduler}, threads {fp.get('num_threads')}, attention {fp.get('attention')}"
            )
        if isinstance(self.compile, dict):
            lines.append(_compile_text(self.compile, self.recompiles_this_run))
        return "\n".join(lines)


def _compile_text(comp: dict[str, Any], this_run: int) -> str:
    # a MODEL's state names its compile mode and backend; a pipeline's record its label
    name = f"{comp['mode']} ({comp.get('backend')})" if "mode" in comp else comp.get("label")
    recompiles = comp.get("recompiles")
    n = len(recompiles) if isinstance(recompiles, list) else recompiles
    text = (
        f"compile {name}: {comp.get('status')}, {comp.get('graphs')} graph(s), {n} recompile(s); "
        f"this run: {this_run} recompile(s)"
    )
    text += "".join(f"\n  recompiled: {str(r)[:200]}" for r in comp.get("recompile_reasons_this_run") or [])
    text += "".join(f"\nWARNING: {str(w)[:300]}" for w in comp.get("warnings") or [])
    if comp.get("disabled"):
        reasons = comp.get("fallbacks") or ["unknown reason"]
        text += f"\nCOMPILE FAILED -> ran EAGER: {str(reasons[-1])[:300]}"
    return text


def for_model(
    *,
    seed: int,
    batch: int,
    batch_seed_mode: str,
    steps: int,
    cfg: float,
    denoise: float,
    sampler: str,
    scheduler: str,
    samples: torch.Tensor,
    settings: Mapping[str, Any],
    host: Mapping[str, Any],
    during: Mapping[str, Any] | None,
    compile: dict[str, Any] | str,
    model_identity: Mapping[str, Any],
    model_file: Mapping[str, Any],
    seconds: float,
    details: dict[str, Any],
) -> RunRecord:
    """The run record of one Seeded Sampler run (``kind="model"``, ``output="latent"``).

    Args:
        seed: the node's seed. batch: the LATENT's batch size. batch_seed_mode: ``"incremental"`` or ``"comfy"``
            (seeds: :func:`~..determinism.noise.item_seeds`, without ``batch_index``).
        steps / cfg / denoise / sampler / scheduler: the node's sampler settings.
        samples: the denoised latent ``[B, C, H, W]`` (or 5-D), hashed exactly (:func:`~.hashing.tensor_digest`).
        settings: the MODEL's output-relevant settings, in record order (``device``, ``dtype``, ``attention``,
            ``qkv_fusion``, ``channels_last``, ``compile``, ``determinism``, and ``quantize`` when on): fingerprint
            fields after the built-in ones.
        host: the running ComfyUI's facts (versions, determinism-relevant settings), fingerprint fields after
            ``settings``.
        during: ``num_threads``, ``flags`` and ``cpu_settings`` as measured inside sampling (they replace the
            values measured now: the determinism policy is restored after the run); empty or None when no step
            callback ran.
        compile: the MODEL's compile state ("off" or a dict; its ``recompiles_this_run`` is counted).
        model_identity: :func:`~.model_identity` digest fields (its ``cached`` flag is not recorded).
        model_file: ``file`` / ``file_size`` of the loader upstream, or ``{}``.
        seconds: wall time of the sampling call (s), recorded to 0.1 ms.
        details: the MODEL path's facts (per-step noise, QKV counters, ...), recorded as given.
    Returns:
        the validated :class:`RunRecord`.
    Raises:
        ValueError: a fingerprint field colliding with a built-in one, a bad seed/mode, or a field
            :class:`RunRecord` refuses. TypeError: a fingerprint value without a stable JSON form.
    """
    fp = environment_fingerprint(measured=during, **settings, **host)  # after sampling the policy is restored
    fp["flags_measured"] = "during sampling" if during else "after sampling (no step callback ran)"
    return _record(
        "model",
        seeds=item_seeds(seed, batch, batch_seed_mode),
        batch_seed_mode=batch_seed_mode,
        steps=steps,
        cfg=cfg,
        denoise=denoise,
        sampler=sampler,
        scheduler=scheduler,
        output="latent",
        tensor=samples,
        fingerprint=fp,
        compile=compile,
        recompiles_this_run=(compile.get("recompiles_this_run") or 0) if isinstance(compile, dict) else 0,
        seconds=seconds,
        details=details,
        model={**{k: v for k, v in model_identity.items() if k != "cached"}, **model_file},
    )


def for_pipeline(
    *,
    seed: int,
    batch: int,
    steps: int,
    cfg: float,
    scheduler_class: str,
    images: torch.Tensor,
    environment: Mapping[str, Any],
    host: Mapping[str, Any],
    determinism: Any,
    compile: dict[str, Any] | None,
    recompiles_this_run: int,
    seconds: float,
    details: dict[str, Any],
) -> RunRecord:
    """The run record of one Pipeline Sampler run (``kind="pipeline"``, ``output="image"``).

    Args:
        seed: the node's seed. batch: the number of images (seeds: :func:`~..determinism.noise.item_seeds`,
            ``batch_seed_mode`` :data:`PIPELINE_SEED_MODE`).
        steps / cfg: ``num_inference_steps`` / ``guidance_scale`` (``denoise`` is recorded as 1.0).
        scheduler_class: the pipeline's scheduler class name (recorded as ``sampler``; ``scheduler`` is
            "pipeline's own").
        images: the IMAGE ``[B, H, W, 3]`` float32, hashed as the uint8 pixels SaveImage writes
            (:func:`~.hashing.hash_image`).
        environment: the pipeline report's environment fingerprint (``core.pipelines.pipeline_report``).
        host: the running ComfyUI's facts (versions, determinism-relevant settings), fingerprint fields after
            ``environment``.
        determinism: the policy in effect (its ``as_dict()``) or the text saying none was set; the last
            fingerprint field.
        compile: the compile record's dict, or None when not compiled (recorded "off").
        recompiles_this_run: recompiles counted during this run. seconds: wall time (s), recorded to 0.1 ms.
        details: the pipeline path's facts (prompt, source, LoRA, ...); ``fingerprint_digest`` (of the
            fingerprint) is appended.
    Returns:
        the validated :class:`RunRecord`.
    Raises:
        ValueError: a bad seed, or a field :class:`RunRecord` refuses. TypeError: a fingerprint value without a
            stable JSON form (in the digest).
    """
    env = {**environment, **host}
    env["determinism"] = determinism
    return _record(
        "pipeline",
        seeds=item_seeds(seed, batch),
        batch_seed_mode=PIPELINE_SEED_MODE,
        steps=steps,
        cfg=cfg,
        denoise=1.0,
        sampler=scheduler_class,
        scheduler="pipeline's own",
        output="image",
        tensor=images,
        fingerprint=env,
        compile=compile or "off",
        recompiles_this_run=recompiles_this_run,
        seconds=seconds,
        details={**details, "fingerprint_digest": fingerprint_digest(env)},
        model={},
    )


def _record(
    kind: str,
    *,
    seeds: list[int],
    batch_seed_mode: str,
    steps: int,
    cfg: float,
    denoise: float,
    sampler: str,
    scheduler: str,
    output: str,
    tensor: torch.Tensor,
    fingerprint: dict[str, Any],
    compile: dict[str, Any] | str,
    recompiles_this_run: int,
    seconds: float,
    details: dict[str, Any],
    model: dict[str, Any],
) -> RunRecord:
    """The core both builders share: the output's shape and digest (a latent's exact bytes, an image's uint8
    pixels), the timing to 0.1 ms, field order of the record."""
    digest = tensor_digest(tensor) if output == "latent" else hash_image(tensor)
    return RunRecord(
        kind=kind,
        seeds=seeds,
        batch_seed_mode=batch_seed_mode,
        steps=steps,
        cfg=cfg,
        denoise=denoise,
        sampler=sampler,
        scheduler=scheduler,
        output=output,
        output_shape=list(tensor.shape),
        output_sha256=digest,
        fingerprint=fingerprint,
        compile=compile,
        model=model,
        recompiles_this_run=recompiles_this_run,
        seconds=round(seconds, 4),
        details=details,
    )
