"""Attention-backend choice for a diffusers model: diffusers' dispatcher where its processors support it,
otherwise a torch SDPA backend pinned around each pipeline call.

diffusers 0.42 has two kinds of attention processors: newer ones (Flux, Wan, QwenImage ...) carry an
``_attention_backend`` attribute and go through ``diffusers.models.attention_dispatch``, so
``model.set_attention_backend(name)`` changes them; older ones (``AttnProcessor2_0`` in the SD UNet and the
VAEs) call ``F.scaled_dot_product_attention`` directly and ignore it. For those a torch SDPA backend can only
be chosen with ``torch.nn.attention.sdpa_kernel`` at call time (:func:`~..optimize.attention.sdpa_context`).

``ModelMixin.set_attention_backend`` also sets diffusers' *process-global* active backend
(``_AttentionBackendRegistry.set_active_backend``); :func:`set_model_attention_backend` restores it right
away, so only the model's own processors change.
"""

from __future__ import annotations

from typing import Any

import torch

from ..optimize.attention import SDPA_BACKENDS, check_sdpa_backend, plan_sdpa_backend

__all__ = [
    "UnsupportedAttentionError",
    "TORCH_TO_DIFFUSERS",
    "attention_names",
    "diffusers_backend_names",
    "dispatch_counts",
    "set_model_attention_backend",
    "resolve_attention",
]

TORCH_TO_DIFFUSERS: dict[str, str] = {
    "auto": "native",
    "math": "_native_math",
    "flash": "_native_flash",
    "efficient": "_native_efficient",
    "cudnn": "_native_cudnn",
}
_DIFFUSERS_TO_TORCH = {v: k for k, v in TORCH_TO_DIFFUSERS.items()}


class UnsupportedAttentionError(ValueError):
    """The requested attention backend cannot be used for this model / device / dtype (message says why)."""


def diffusers_backend_names() -> list[str]:
    """Values of diffusers' ``AttentionBackendName`` (empty when this diffusers has no dispatcher)."""
    try:
        from diffusers.models.attention_dispatch import AttentionBackendName
    except ImportError:
        return []
    return [m.value for m in AttentionBackendName]


def attention_names() -> list[str]:
    """Every accepted ``OptimizeOptions.attention`` value: torch SDPA names, then diffusers backend names."""
    return list(SDPA_BACKENDS) + [n for n in diffusers_backend_names() if n not in SDPA_BACKENDS]


def _attention_modules(model: torch.nn.Module) -> list[tuple[str, Any]]:
    out = []
    for path, mod in model.named_modules():
        proc = getattr(mod, "processor", None)
        if proc is not None and hasattr(mod, "set_processor"):
            out.append((path, proc))
    return out


def dispatch_counts(model: torch.nn.Module) -> tuple[int, int]:
    """``(dispatching, direct)``: attention modules whose processor has ``_attention_backend`` / has not."""
    mods = _attention_modules(model)
    n = sum(1 for _, p in mods if hasattr(p, "_attention_backend"))
    return n, len(mods) - n


def set_model_attention_backend(model: torch.nn.Module, name: str) -> int:
    """``model.set_attention_backend(name)`` without leaving diffusers' global active backend changed.

    Returns how many processors now carry the backend. Raises :class:`UnsupportedAttentionError` when
    diffusers rejects the name or its requirements (missing package ...) are not met.
    """
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    if not hasattr(model, "set_attention_backend"):
        raise UnsupportedAttentionError(f"{type(model).__name__} has no set_attention_backend (diffusers too old?)")
    previous = _AttentionBackendRegistry.get_active_backend()[0]
    try:
        model.set_attention_backend(name)
    except (ValueError, RuntimeError, ImportError) as e:
        raise UnsupportedAttentionError(f"diffusers attention backend {name!r} unusable: {e}") from e
    finally:
        _AttentionBackendRegistry.set_active_backend(previous)
    return sum(1 for _, p in _attention_modules(model) if getattr(p, "_attention_backend", None) is not None)


def resolve_attention(
    name: str, model: torch.nn.Module, device: str | torch.device, dtype: torch.dtype
) -> tuple[str | None, str]:
    """Decide how to apply attention backend ``name`` to ``model``: ``(diffusers_name, sdpa_name)``.

    ``diffusers_name``: what to pass to ``set_attention_backend`` (None: nothing). ``sdpa_name``: the torch
    SDPA backend to pin around each pipeline call ("auto": none). A torch SDPA name is first checked to
    run on ``device``/``dtype``, with a mask and in fp32 too (:func:`~..optimize.attention.plan_sdpa_backend`: the pin
    covers text encoders and the VAE, so a backend torch refuses in any of those cases is refused); it goes to the
    dispatcher for dispatching processors *and* is pinned around the call for everything else (direct
    processors, the VAE and the text encoders). A diffusers-only name (e.g. "flex") needs dispatching
    processors; "native"/"_native_*" map back to torch SDPA names for direct processors.

    Raises:
        UnsupportedAttentionError: unknown name, a torch backend that does not run here, or a diffusers-only
            backend on a model whose processors all call SDPA directly.
    """
    dispatching, direct = dispatch_counts(model)
    model_name = type(model).__name__
    if name in SDPA_BACKENDS:
        if name == "auto":
            return None, "auto"
        try:
            plan = plan_sdpa_backend(name, device, dtype)
        except ValueError as e:
            raise UnsupportedAttentionError(str(e)) from e
        if plan.falls_back:  # pinned around the whole call: no per-call fallback, so refused up front
            raise UnsupportedAttentionError(
                f"SDPA backend {name!r} is pinned around the whole pipeline call (text encoders and VAE included), "
                f"and torch refuses it on {plan.device} for: {'; '.join(plan.falls_back)} (e.g. T5's float attention "
                "mask, a VAE decoded in fp32). Use auto or math."
            )
        return (TORCH_TO_DIFFUSERS[name] if dispatching else None), name
    known = diffusers_backend_names()
    if name not in known:
        raise UnsupportedAttentionError(
            f"unknown attention backend {name!r}; expected one of {', '.join(attention_names())}"
        )
    torch_name = _DIFFUSERS_TO_TORCH.get(name)
    if torch_name is not None and torch_name != "auto":
        try:
            check_sdpa_backend(torch_name, device, dtype)
        except ValueError as e:
            raise UnsupportedAttentionError(str(e)) from e
    if not dispatching:
        if torch_name is None:
            raise UnsupportedAttentionError(
                f"{model_name}'s {direct} attention processors call torch SDPA directly and ignore diffusers "
                f"attention backends, so {name!r} cannot apply; use one of {', '.join(SDPA_BACKENDS)}"
            )
        return None, torch_name
    return name, (torch_name or "auto")
