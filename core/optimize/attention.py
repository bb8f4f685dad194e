"""Pinned PyTorch SDPA backends: select (:func:`sdpa_context`) and probe (:func:`check_sdpa_backend`).

Measured on CPU (``tests/core/test_optimize_attention.py``, figures in ``docs/measurements.md``): only
``auto``, ``math`` and ``flash`` run; ``auto`` dispatches to flash (bit-equal to it); math != flash
bitwise. The backend therefore belongs in the output fingerprint.

A pinned backend is probed in the cases a model meets (:func:`plan_sdpa_backend`): the *compute* dtype, with and
without an attention mask, fp32, and under strict deterministic algorithms when the policy asks for them. torch's
``sdp_utils.cpp`` refuses flash with any ``attn_mask`` and in fp32 on CUDA, and cuDNN attention under strict
determinism; CPU kernels accept more, so only a GPU shows those refusals (``tests/comfy/test_gpu_correctness.py``).
A backend that fails the main case is refused up front; a call that meets a refused case falls back to torch's own
choice, counted per process (:func:`run_pinned`, :func:`fallback_counts`) and named in the run record.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

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
    "BackendPlan",
    "plan_sdpa_backend",
    "is_no_kernel_error",
    "run_pinned",
    "fallback_counts",
    "fallbacks_since",
]

SDPA_BACKENDS: tuple[str, ...] = ("auto", "math", "efficient", "flash", "cudnn")

_ENUM = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}

# (name, device, dtype, head_dim, mask, deterministic) -> None when the backend ran, else the error text.
_PROBE_CACHE: dict[tuple[str, str, torch.dtype, int, bool, bool], str | None] = {}
# (backend, why) -> calls that fell back from the pinned backend to torch's own choice (process-wide counter).
_FALLBACKS: Counter[tuple[str, str]] = Counter()


class UnsupportedBackendError(ValueError):
    """An SDPA backend does not run on the requested device/dtype (message names what does)."""


def _validate(name: str) -> None:
    if name not in SDPA_BACKENDS:
        raise ValueError(f"unknown SDPA backend {name!r}; expected one of {', '.join(SDPA_BACKENDS)}")


def sdpa_context(name: str) -> AbstractContextManager[Any]:
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


def _deterministic_mode(on: bool):
    """Context: ``torch.use_deterministic_algorithms(on)`` (strict) for the block, the previous setting restored."""

    @contextlib.contextmanager
    def ctx():
        before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
        torch.use_deterministic_algorithms(on)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])

    return ctx()


def _probe(
    name: str, device: str, dtype: torch.dtype, head_dim: int, mask: bool = False, deterministic: bool = False
) -> str | None:
    key = (name, device, dtype, head_dim, mask, deterministic)
    if key in _PROBE_CACHE:
        return _PROBE_CACHE[key]
    err: str | None = None
    try:
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(1, 2, 16, head_dim, generator=gen).to(device=device, dtype=dtype)
        # a float additive mask, as ComfyUI builds for masked conds and T5/Chroma attention masks
        attn_mask = torch.zeros(1, 1, 16, 16).to(device=device, dtype=dtype) if mask else None
    except Exception as e:  # device unusable (no driver, not compiled with it, bad name ...)
        err = f"device unusable: {type(e).__name__}: {e}"
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.inference_mode(), _deterministic_mode(deterministic), sdpa_context(name):
                    F.scaled_dot_product_attention(q, q, q, attn_mask=attn_mask)
        except (RuntimeError, NotImplementedError, ValueError) as e:
            err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    _PROBE_CACHE[key] = err
    return err


def _norm_device(device: str | torch.device) -> str:
    return str(torch.device(device))


def available_sdpa_backends(
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    head_dim: int = 64,
    mask: bool = False,
    deterministic: bool = False,
) -> list[str]:
    """Names from :data:`SDPA_BACKENDS` that actually run a tiny SDPA call ``[1, 2, 16, head_dim]`` on
    ``device`` in ``dtype`` (with a float ``attn_mask`` when ``mask``; under strict
    ``torch.use_deterministic_algorithms`` when ``deterministic``; results cached per case). Empty when the
    device itself is unusable (CPU: see ``docs/measurements.md``).
    Real shapes can still hit per-shape kernel limits (e.g. head_dim caps of fused GPU kernels)."""
    dev = _norm_device(device)
    return [n for n in SDPA_BACKENDS if _probe(n, dev, dtype, head_dim, mask, deterministic) is None]


def _case_text(dtype: torch.dtype, mask: bool, deterministic: bool) -> str:
    return (
        f"{dtype}"
        + (" with an attention mask" if mask else "")
        + (" under strict deterministic algorithms" if deterministic else "")
    )


def check_sdpa_backend(
    name: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    head_dim: int = 64,
    mask: bool = False,
    deterministic: bool = False,
) -> None:
    """Raise unless SDPA backend ``name`` runs on ``device`` with ``dtype`` (found by trying a tiny call).

    Args:
        name: one of :data:`SDPA_BACKENDS`.
        device, dtype: where and in which dtype attention runs (the *compute* dtype: for fp8 weights
            ComfyUI's ``manual_cast_dtype``, never the storage dtype).
        head_dim: last dimension of q/k/v.
        mask: try the call with a float ``attn_mask`` [1, 1, 16, 16] (torch's flash kernel refuses any mask on CUDA).
        deterministic: try it under strict ``torch.use_deterministic_algorithms(True)`` (restored after; torch
            refuses cuDNN attention there).
    Raises:
        ValueError: unknown name.
        UnsupportedBackendError: (a ``ValueError``) the backend fails in that case; the message names the device,
            dtype, the case, the underlying error and the backends that do work there.
    Results are cached per ``(name, device, dtype, head_dim, mask, deterministic)``.
    """
    _validate(name)
    dev = _norm_device(device)
    err = _probe(name, dev, dtype, head_dim, mask, deterministic)
    if err is None:
        return
    working = available_sdpa_backends(dev, dtype, head_dim=head_dim, mask=mask, deterministic=deterministic)
    works = ", ".join(working) if working else "none"
    raise UnsupportedBackendError(
        f"SDPA backend {name!r} does not run on device {dev!r} with {_case_text(dtype, mask, deterministic)} "
        f"(torch {torch.version.__version__}): {err}. Backends that work there: {works}."
    )


@dataclass(frozen=True)
class BackendPlan:
    """What a pinned SDPA backend will do for a model: it runs in the main case (checked), and the other cases it
    will meet where it does not run (``falls_back``: each a text such as ``"torch.float32 with an attention mask"``).
    In those cases a per-call pin falls back to torch's own choice, counted (:func:`run_pinned`)."""

    backend: str
    device: str
    dtype: torch.dtype
    deterministic: bool
    falls_back: tuple[str, ...] = ()

    def as_text(self) -> str:
        """One line for a node report."""
        if not self.falls_back:
            return f"backend {self.backend} runs in every probed case"
        return (
            f"backend {self.backend} does not run for: {'; '.join(self.falls_back)}: those calls fall back to "
            "torch's own choice (counted in the run record)"
        )


def plan_sdpa_backend(
    name: str,
    device: str | torch.device,
    dtype: torch.dtype,
    *,
    head_dim: int = 64,
    deterministic: bool = False,
    extra_dtypes: tuple[torch.dtype, ...] = (torch.float32,),
) -> BackendPlan:
    """Probe backend ``name`` in the cases a model meets: ``dtype`` without and with a mask, and each of
    ``extra_dtypes`` (default fp32: ComfyUI upcasts some attention, pipelines decode the VAE in fp32) without and
    with a mask, all under strict determinism when ``deterministic``.

    Raises:
        ValueError / UnsupportedBackendError: as :func:`check_sdpa_backend` for the main case (``dtype``, no mask):
            a backend that never runs there is refused up front (e.g. cuDNN under a strict determinism policy).
    Returns:
        :class:`BackendPlan` listing the other cases where the backend does not run.
    """
    check_sdpa_backend(name, device, dtype, head_dim=head_dim, deterministic=deterministic)
    dev = _norm_device(device)
    cases = [(dtype, True)] + [(d, m) for d in extra_dtypes if d != dtype for m in (False, True)]
    failing = tuple(_case_text(d, m, False) for d, m in cases if _probe(name, dev, d, head_dim, m, deterministic))
    return BackendPlan(name, dev, dtype, deterministic, failing)


def is_no_kernel_error(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's refusal to find an SDPA kernel under the enabled backends (a RuntimeError
    "No viable backend ..." / "No available kernel ...")."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("No viable backend" in text or "No available kernel" in text)


def run_pinned(name: str, fn: Callable[..., Any], *args: Any, why: str = "", **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` under :func:`sdpa_context` ``(name)``; when torch finds no kernel for this call
    (:func:`is_no_kernel_error`), the call is counted (:func:`fallback_counts`, key ``(name, why)``) and run again
    with torch's own choice. Any other error propagates."""
    try:
        with sdpa_context(name):
            return fn(*args, **kwargs)
    except RuntimeError as e:
        if name == "auto" or not is_no_kernel_error(e):
            raise
    _FALLBACKS[(name, why)] += 1
    return fn(*args, **kwargs)


def fallback_counts() -> dict[tuple[str, str], int]:
    """Calls that fell back from a pinned backend so far in this process: ``{(backend, why): calls}``."""
    return dict(_FALLBACKS)


def fallbacks_since(before: dict[tuple[str, str], int]) -> list[str]:
    """Lines ``"flash -> auto: 12 calls (torch.float32 with an attention mask)"`` for the fallbacks counted since
    ``before`` (a :func:`fallback_counts` snapshot); empty when none."""
    lines = []
    for (name, why), n in sorted(_FALLBACKS.items()):
        d = n - before.get((name, why), 0)
        if d > 0:
            lines.append(f"{name} -> auto: {d} calls" + (f" ({why})" if why else ""))
    return lines


def clear_sdpa_backend_cache() -> None:
    """Forget the cached probe results of :func:`check_sdpa_backend` / :func:`available_sdpa_backends`."""
    _PROBE_CACHE.clear()
