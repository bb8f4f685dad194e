"""Pinned PyTorch SDPA backends: select (:func:`sdpa_context`) and probe (:func:`check_sdpa_backend`).

Measured on CPU (``tests/core/test_optimize_attention.py``, figures in ``docs/measurements.md``): only
``auto``, ``math`` and ``flash`` run; ``auto`` dispatches to flash (bit-equal to it); math != flash
bitwise. The backend therefore belongs in the output fingerprint.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, ContextManager

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = [
    "SDPA_BACKENDS",
    "UnsupportedBackendError",
    "sdpa_context",
    "check_sdpa_backend",
    "available_sdpa_backends",
    "clear_sdpa_backend_cache",
]

SDPA_BACKENDS: tuple[str, ...] = ("auto", "math", "efficient", "flash", "cudnn")

_ENUM = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}

# (name, device, dtype, head_dim) -> None when the backend ran, else the error text.
_PROBE_CACHE: dict[tuple[str, str, torch.dtype, int], str | None] = {}


class UnsupportedBackendError(ValueError):
    """An SDPA backend does not run on the requested device/dtype (message names what does)."""


def _validate(name: str) -> None:
    if name not in SDPA_BACKENDS:
        raise ValueError(f"unknown SDPA backend {name!r}; expected one of {', '.join(SDPA_BACKENDS)}")


def sdpa_context(name: str) -> ContextManager[Any]:
    """Context manager restricting ``F.scaled_dot_product_attention`` to backend ``name``.

    ``"auto"`` -> ``contextlib.nullcontext()`` (PyTorch's own choice); otherwise
    ``torch.nn.attention.sdpa_kernel([SDPBackend.X])``, which changes torch's SDPA flags for the block
    and restores them on exit. Raises ``ValueError`` for a name not in :data:`SDPA_BACKENDS`. Does not
    check that the backend runs (see :func:`check_sdpa_backend`).
    """
    _validate(name)
    if name == "auto":
        return contextlib.nullcontext()
    return sdpa_kernel([_ENUM[name]])


def _probe(name: str, device: str, dtype: torch.dtype, head_dim: int) -> str | None:
    key = (name, device, dtype, head_dim)
    if key in _PROBE_CACHE:
        return _PROBE_CACHE[key]
    err: str | None = None
    try:
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(1, 2, 16, head_dim, generator=gen).to(device=device, dtype=dtype)
    except Exception as e:  # device unusable (no driver, not compiled with it, bad name ...)
        err = f"device unusable: {type(e).__name__}: {e}"
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.inference_mode(), sdpa_context(name):
                    F.scaled_dot_product_attention(q, q, q)
        except (RuntimeError, NotImplementedError, ValueError) as e:
            err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    _PROBE_CACHE[key] = err
    return err


def _norm_device(device: str | torch.device) -> str:
    return str(torch.device(device))


def available_sdpa_backends(
    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, *, head_dim: int = 64
) -> list[str]:
    """Names from :data:`SDPA_BACKENDS` that actually run a tiny SDPA call ``[1, 2, 16, head_dim]`` on
    ``device`` in ``dtype`` (results cached per ``(name, device, dtype, head_dim)``). Empty when the
    device itself is unusable (CPU: see ``docs/measurements.md``).
    Real shapes can still hit per-shape kernel limits (e.g. head_dim caps of fused GPU kernels)."""
    dev = _norm_device(device)
    return [n for n in SDPA_BACKENDS if _probe(n, dev, dtype, head_dim) is None]


def check_sdpa_backend(
    name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, *, head_dim: int = 64
) -> None:
    """Raise unless SDPA backend ``name`` runs on ``device`` with ``dtype`` (found by trying a tiny call).

    Raises ``ValueError`` for an unknown name and :class:`UnsupportedBackendError` (a ``ValueError``)
    when the backend fails there; the message names the device, dtype, the underlying error and the
    backends that do work there. Results are cached per ``(name, device, dtype, head_dim)``.
    """
    _validate(name)
    dev = _norm_device(device)
    err = _probe(name, dev, dtype, head_dim)
    if err is None:
        return
    working = available_sdpa_backends(dev, dtype, head_dim=head_dim)
    works = ", ".join(working) if working else "none"
    raise UnsupportedBackendError(
        f"SDPA backend {name!r} does not run on device {dev!r} with {dtype} (torch {torch.version.__version__}): "
        f"{err}. Backends that work there: {works}."
    )


def clear_sdpa_backend_cache() -> None:
    """Forget the cached probe results of :func:`check_sdpa_backend` / :func:`available_sdpa_backends`."""
    _PROBE_CACHE.clear()
