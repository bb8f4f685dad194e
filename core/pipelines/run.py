"""Run an (optimized) diffusers pipeline reproducibly: one CPU generator per image, tracked compiles."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ..compile.record import CompileRecord
from ..compile.registry import REGISTRY
from ..compile.use import Compiled
from ..determinism.apply import deterministic
from ..determinism.noise import item_seeds
from ..determinism.policy import DeterminismPolicy
from ..determinism.randn_route import portable_generator_randn, route_record
from ..optimize.attention import check_sdpa_backend, sdpa_context
from ..record.environment import environment_fingerprint, fingerprint_digest
from .load import count_params, denoiser_of, module_components, run_device
from .state import peek_state

__all__ = ["generate", "warmup", "WarmupResult", "compile_record", "pipeline_report", "image_generators"]


def image_generators(seed: int, batch: int) -> list[torch.Generator]:
    """``batch`` CPU generators, generator ``i`` seeded with ``seed + i``.

    diffusers' ``randn_tensor`` draws item ``i`` of a batch from ``generator[i]`` when given a list, so
    image ``i``'s initial noise (and any per-step noise) equals that of a batch-1 run at ``seed + i``.
    Raises ``ValueError`` for ``batch < 1`` or seeds outside ``[0, 2**64 - 1]`` and ``TypeError`` for a
    non-integer seed (:func:`~..determinism.noise.item_seeds`).
    """
    return [torch.Generator(device="cpu").manual_seed(s) for s in item_seeds(seed, batch)]


def compile_record(pipe: Any) -> CompileRecord | None:
    """The :class:`~..compile_record.CompileRecord` of ``pipe``'s compiled denoiser, or None when not compiled."""
    state = peek_state(pipe)
    return state.record if state is not None else None


def _call_kwargs(
    pipe: Any,
    prompt: str,
    negative_prompt: str,
    steps: int,
    guidance: float | None,
    width: int | None,
    height: int | None,
    gens: list[torch.Generator],
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    params = inspect.signature(pipe.__call__).parameters
    kw: dict[str, Any] = {
        "prompt": prompt,
        "num_inference_steps": steps,
        "generator": gens,
        "num_images_per_prompt": len(gens),
        "output_type": "pt",
    }
    if negative_prompt:
        if "negative_prompt" not in params:
            raise ValueError(f"{type(pipe).__name__} takes no negative_prompt")
        kw["negative_prompt"] = negative_prompt
    if guidance is not None:
        kw["guidance_scale"] = float(guidance)
    if width is not None:
        kw["width"] = int(width)
    if height is not None:
        kw["height"] = int(height)
    kw.update(extra or {})
    # diffusers pipelines swallow unknown names through **kwargs (deprecated callbacks): refuse them here,
    # so a typo cannot silently change nothing
    unknown = [k for k in kw if k not in params or params[k].kind is inspect.Parameter.VAR_KEYWORD]
    if unknown:
        raise ValueError(f"{type(pipe).__name__}.__call__ takes no {', '.join(unknown)}")
    return kw


def _step_callback(pipe: Any, on_step: Callable[[], None] | None) -> dict[str, Any]:
    """``{"callback_on_step_end": ...}`` calling ``on_step()`` after each denoising step, where the pipeline
    takes one (diffusers >= 0.22 text-to-image pipelines); else ``{}``. The callback changes nothing."""
    if on_step is None or "callback_on_step_end" not in inspect.signature(pipe.__call__).parameters:
        return {}

    def callback(_pipe: Any, _step: int, _timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        on_step()
        return callback_kwargs

    return {"callback_on_step_end": callback}


def _run_once(pipe: Any, kw: dict[str, Any], compiled: Compiled | None, shape: tuple) -> torch.Tensor:
    with contextlib.ExitStack() as stack:
        if compiled is not None:
            stack.enter_context(REGISTRY.run(compiled.record))
        # diffusers' randn_tensor draws each image's noise from its CPU generator: portable bytes (routed only
        # where torch's own differ; half types on torch 2.11 stay torch's own: pipeline_report()["cpu_randn"])
        stack.enter_context(portable_generator_randn())
        # a compiled denoiser: tracked, with its compile cache active (Compiled.run)
        out = pipe(**kw) if compiled is None else compiled.run(lambda: pipe(**kw), shape=shape)
    images = out.images if hasattr(out, "images") else out[0]
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise RuntimeError(f"{type(pipe).__name__} returned {type(images).__name__}, expected a [B,C,H,W] tensor")
    return images.detach().to("cpu", torch.float32).permute(0, 2, 3, 1).contiguous()


def generate(
    pipe: Any,
    prompt: str,
    negative_prompt: str = "",
    *,
    steps: int = 20,
    guidance: float | None = None,
    width: int | None = None,
    height: int | None = None,
    seed: int = 0,
    batch: int = 1,
    output_type: str = "pt",
    policy: DeterminismPolicy | None = None,
    batch_mode: str = "batched",
    extra: dict[str, Any] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> torch.Tensor | np.ndarray:
    """Generate ``batch`` images with one CPU ``torch.Generator`` per image (image ``i``: ``seed + i``).

    Args:
        pipe: a diffusers text-to-image pipeline (optionally :func:`~.optimize.optimize_pipeline`-d).
        prompt / negative_prompt: text; an empty negative prompt is not passed (pipeline default).
        steps: ``num_inference_steps``. guidance: ``guidance_scale`` (None: the pipeline's default).
        width / height: pixels (None: the pipeline's default); must suit the pipeline (multiple of the VAE
            factor, x2 for Flux).
        seed: seed of image 0. batch: number of images (``num_images_per_prompt``).
        output_type: "pt" -> ``torch.Tensor``, "np" -> ``np.ndarray``; both ``[B, H, W, C]`` float32 in
            [0, 1] on the CPU (ComfyUI IMAGE layout).
        policy: run under :func:`~..determinism.deterministic` (global torch flags applied, then restored).
        batch_mode: "batched" (one pipeline call; the initial noise of image ``i`` equals a batch-1 run at
            ``seed + i``, but CPU kernels are not batch-invariant, so pixels can differ from it in the last
            bits: measured max |d| ~1e-6 on the tiny pipelines) or "sequential" (``batch`` batch-1 calls:
            image ``i`` *is* the batch-1 image at ``seed + i``).
        extra: more keyword arguments for the pipeline call (e.g. ``{"max_sequence_length": 64}``).
        on_step: called as ``on_step(done, total)`` after each denoising step (``total`` = ``steps``, times
            ``batch`` in sequential mode), e.g. to drive a progress bar; it may raise to stop the run. Needs
            the pipeline's ``callback_on_step_end`` (else never called).
    Returns:
        the images, ``[B, H, W, C]`` float32 in [0, 1] on the CPU.

    The torch SDPA backend chosen by ``optimize_pipeline`` is pinned around the call, and a compiled
    denoiser's compiles/recompiles are attributed to its :func:`compile_record`.

    Raises:
        ValueError: bad ``batch``/``seed``/``output_type``/``batch_mode``/``steps``, or an argument the
            pipeline does not take. TypeError: non-int seed.
    """
    if output_type not in ("pt", "np"):
        raise ValueError(f"output_type must be 'pt' or 'np', got {output_type!r}")
    if batch_mode not in ("batched", "sequential"):
        raise ValueError(f"batch_mode must be 'batched' or 'sequential', got {batch_mode!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    gens = image_generators(seed, batch)
    state = peek_state(pipe)
    compiled = state.compiled if state is not None else None
    sdpa = state.sdpa_backend if state is not None else "auto"
    shape = (batch, int(height or 0), int(width or 0))
    total, done = steps * (batch if batch_mode == "sequential" else 1), [0]

    def step() -> None:
        done[0] += 1
        on_step(min(done[0], total), total)

    extra = {**(extra or {}), **_step_callback(pipe, step if on_step is not None else None)}
    with contextlib.ExitStack() as stack:
        if policy is not None:
            if policy.strict and sdpa != "auto":  # torch refuses cuDNN attention under strict determinism: say so now
                den = denoiser_of(pipe)[1]
                p = next(den.parameters(), None)
                check_sdpa_backend(
                    sdpa, run_device(pipe), p.dtype if p is not None else torch.float32, deterministic=True
                )
            stack.enter_context(deterministic(policy))
        stack.enter_context(sdpa_context(sdpa))
        if batch_mode == "batched":
            kw = _call_kwargs(pipe, prompt, negative_prompt, steps, guidance, width, height, gens, extra)
            images = _run_once(pipe, kw, compiled, shape)
        else:
            parts = []
            for g in gens:
                kw = _call_kwargs(pipe, prompt, negative_prompt, steps, guidance, width, height, [g], extra)
                parts.append(_run_once(pipe, kw, compiled, (1,) + shape[1:]))
            images = torch.cat(parts, dim=0)
    return images.numpy() if output_type == "np" else images


@dataclass(frozen=True)
class WarmupResult:
    """What :func:`warmup` measured: wall ``seconds`` of the warm-up call; for a compiled denoiser its
    compile-record ``status``, ``graphs`` and ``recompiles`` after the call (None/0 when not compiled)."""

    seconds: float
    compiled: bool
    status: str | None
    graphs: int
    recompiles: int
    target: tuple[int, int, int]

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict."""
        d = asdict(self)
        d["target"] = list(self.target)
        return d


def warmup(
    pipe: Any,
    width: int | None = None,
    height: int | None = None,
    batch: int = 1,
    *,
    steps: int = 2,
    prompt: str = "warm-up",
    guidance: float | None = None,
    extra: dict[str, Any] | None = None,
    policy: DeterminismPolicy | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> WarmupResult:
    """Run one throw-away generation at the target size so a compiled denoiser compiles now, not later.

    The compile record (if any) is marked warm for ``(batch, height, width)``. Compilation does not depend
    on the prompt, seed or step count, only on shapes/dtypes (and guidance on/off, which changes the batch)
    and on global flags such as deterministic algorithms: warm up under the ``policy`` you will generate with.
    ``on_step(done, steps)`` after each step, as for :func:`generate`. Raises what :func:`generate` raises.
    """
    t0 = time.perf_counter()
    generate(
        pipe,
        prompt,
        steps=steps,
        guidance=guidance,
        width=width,
        height=height,
        seed=0,
        batch=batch,
        extra=extra,
        policy=policy,
        on_step=on_step,
    )
    seconds = time.perf_counter() - t0
    target = (batch, int(height or 0), int(width or 0))
    rec = compile_record(pipe)
    if rec is not None:
        REGISTRY.mark_warm(rec, target)
        return WarmupResult(seconds, True, rec.stats.status, rec.stats.graphs, len(rec.stats.recompiles), target)
    return WarmupResult(seconds, False, None, 0, 0, target)


def _module_info(module: torch.nn.Module) -> dict[str, Any]:
    p = next(module.parameters(), None)
    return {
        "class": type(module).__name__,
        "params": count_params(module),
        "dtype": str(p.dtype) if p is not None else None,
        "device": str(p.device) if p is not None else None,
    }


def pipeline_report(pipe: Any, *, environment: bool = True) -> dict[str, Any]:
    """JSON-safe description of ``pipe`` and everything Steadfast did to it.

    Keys: ``pipeline`` (class), ``denoiser`` (component name), ``components`` (class, params, dtype, device per
    module), ``cpu_randn`` (:func:`~..portable_randn.route_record`: how CPU-generator noise of each dtype is drawn
    here: portable, routed to portable, or torch's own half algorithm), ``optimize`` (:meth:`OptimizeReport.as_dict` or
    None), ``sdpa_backend``, ``compile`` (:meth:`CompileRecord.as_dict` or None), ``lora`` (adapters and load events),
    and with ``environment`` also ``environment`` (:func:`~..record.environment.environment_fingerprint` plus the
    output-relevant pipeline settings) and ``fingerprint_digest``.
    """
    state = peek_state(pipe)
    try:
        den_name = denoiser_of(pipe)[0]
    except ValueError:
        den_name = None
    rep = state.report if state is not None else None
    out: dict[str, Any] = {
        "pipeline": type(pipe).__name__,
        "denoiser": den_name,
        "components": {k: _module_info(m) for k, m in module_components(pipe).items()},
        "optimize": rep.as_dict() if rep is not None else None,
        "sdpa_backend": state.sdpa_backend if state is not None else "auto",
        # how diffusers' CPU-generator draws come out per dtype (portable, routed, or torch's own half algorithm)
        "cpu_randn": route_record(),
        "compile": state.record.as_dict() if state is not None and state.record is not None else None,
        "lora": {
            "adapters": list(state.adapters) if state else [],
            "hotswap_rank": state.hotswap_rank if state else None,
            "events": [dict(e) for e in state.lora_events] if state else [],
        },
    }
    if environment:
        fields = rep.fingerprint_fields() if rep is not None else {"pipeline_compile": "off"}
        comps = out["components"]
        fields["pipeline_class"] = out["pipeline"]
        fields["pipeline_dtype"] = comps[den_name]["dtype"] if den_name else None
        fields["pipeline_lora"] = list(state.adapters) if state else []
        env = environment_fingerprint(**fields)
        out["environment"] = env
        out["fingerprint_digest"] = fingerprint_digest(env)
    return out
