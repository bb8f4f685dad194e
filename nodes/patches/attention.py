"""Optimize Model's ``attention``: ``transformer_options["optimized_attention_override"]`` -> ComfyUI's SDPA path under
``torch.nn.attention.sdpa_kernel``, probed up front.

One plain function per backend: ModelPatcher.clone() deep-copies model_options, which keeps functions (atomic for
copy.deepcopy) but would rebuild a partial.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import comfy.ldm.modules.attention as comfy_attention

from ...core.optimize import attention as sdpa
from ...core.optimize.plan import StepReport
from .options import steadfast_options
from .precision import compute_dtype

__all__ = [
    "attention_override",
    "comfy_attention_passthrough",
    "policy_is_strict",
    "plan_attention",
    "set_attention",
    "keep_comfy_attention",
    "add_attention",
]


@functools.cache
def attention_override(backend: str) -> Callable:
    """The ``optimized_attention_override`` callable that runs PyTorch SDPA on ``backend``.

    Same object for the same backend (stable compile guards, survives ``model.clone()``). It takes
    ComfyUI's arguments ``(func, q, k, v, heads, ...)``, ignores ``func`` and calls
    ``attention_pytorch`` inside :func:`core.optimize.attention.sdpa_context`; a call for which torch has no kernel
    under the pin (e.g. CUDA flash with a mask or in fp32) falls back to torch's own choice, counted
    (:func:`core.optimize.attention.run_pinned`; the run record lists the fallbacks of the run).
    """
    sdpa.sdpa_context(backend)  # ValueError for an unknown name, before anything is registered

    def steadfast_sdpa(func: Callable, *args, **kwargs):
        q = args[0] if args else kwargs.get("q")
        mask = args[4] if len(args) > 4 else kwargs.get("mask")
        why = f"{getattr(q, 'dtype', '?')}" + (" with an attention mask" if mask is not None else "")
        return sdpa.run_pinned(backend, comfy_attention.attention_pytorch, *args, why=why, **kwargs)

    steadfast_sdpa.__name__ = steadfast_sdpa.__qualname__ = f"steadfast_sdpa_{backend}"
    return steadfast_sdpa


def comfy_attention_passthrough(func: Callable, *args, **kwargs):
    """``optimized_attention_override`` that calls ComfyUI's own choice (``func``) unchanged.

    Installed for compiled models with ``attention=comfy``, so every compiled call of ours carries an
    override that Dynamo guards on (:func:`core.compile.guards.comfy_guard_filter` keeps those guards): a
    graph traced with an SDPA override is never reused for ComfyUI's attention, or the other way round.
    """
    return func(*args, **kwargs)


def policy_is_strict(model) -> bool:
    """Whether ``model`` carries a Determinism Setup policy with ``strict`` on (torch then refuses cuDNN attention)."""
    policy = steadfast_options(model).determinism
    return bool(isinstance(policy, dict) and policy.get("strict"))


def plan_attention(model, backend: str, device) -> sdpa.BackendPlan:
    """Probe SDPA ``backend`` for ``model`` on ``device``: in its compute dtype (:func:`compute_dtype`), with and
    without a mask, in fp32, under strict determinism when the model carries a strict policy. Raises
    :class:`core.optimize.attention.UnsupportedBackendError` when the backend cannot run the main case (refused up
    front: e.g. cuDNN under a strict policy); other failing cases fall back per call, counted."""
    return sdpa.plan_sdpa_backend(backend, device, compute_dtype(model), deterministic=policy_is_strict(model))


def set_attention(model, backend: str) -> None:
    """Route the model's attention through PyTorch SDPA with a pinned backend ("auto" = torch's choice)."""
    to = model.model_options.setdefault("transformer_options", {})
    to["optimized_attention_override"] = attention_override(backend)
    steadfast_options(model).attention = f"pytorch_sdpa:{backend}"


def keep_comfy_attention(model) -> None:
    """Pin ComfyUI's own attention choice with an explicit pass-through override (for compiled models)."""
    to = model.model_options.setdefault("transformer_options", {})
    to.setdefault("optimized_attention_override", comfy_attention_passthrough)


def add_attention(model, backend: str, device, dtype: str, compiling: bool) -> StepReport:
    """Optimize Model's attention step on ``model`` (a clone).

    Args:
        model: a ComfyUI ``ModelPatcher`` clone, its precision already set.
        backend: an SDPA backend ("auto", "math", "efficient", "flash", "cudnn") or "comfy" (ComfyUI's own).
        device: the torch device the model runs on (the probe runs there).
        dtype: the compute dtype as text, for the report line (the probe reads the model's own).
        compiling: whether the model will be compiled: ``comfy`` is then pinned explicitly, so compiled graphs
            guard on it.
    Returns:
        an "attention" :class:`StepReport` (applied when an SDPA backend is routed or ComfyUI's choice pinned),
        one report line.
    Raises:
        core.optimize.attention.UnsupportedBackendError: the backend cannot run the main case here
            (:func:`plan_attention`), before anything is changed.
    """
    if backend != "comfy":
        # probed in the compute dtype (fp8 weights compute in manual_cast_dtype), with a mask, in fp32, and
        # under the model's strict policy: UnsupportedBackendError names the cases and what runs there
        plan = plan_attention(model, backend, device)
        set_attention(model, backend)
        return StepReport(
            "attention",
            True,
            ["diffusion_model"],
            {"requested": backend, "sdpa": backend},
            lines=[f"attention: PyTorch SDPA, backend {backend} on {device} ({dtype}); {plan.as_text()}"],
        )
    if compiling:
        keep_comfy_attention(model)
        return StepReport(
            "attention",
            True,
            ["diffusion_model"],
            {"requested": backend},
            lines=["attention: ComfyUI default (kept explicitly, so compiled graphs guard on it)"],
        )
    return StepReport(
        "attention", False, details={"requested": backend}, lines=["attention: ComfyUI default (not pinned)"]
    )
