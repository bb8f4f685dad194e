"""Measured (never assumed) parity between a baseline and an optimized computation.

Equality is decided on bytes: each output tensor's :func:`~..hashing.tensor_digest` (SHA-256 over
dtype, shape and C-order bytes). So ``0.0`` vs ``-0.0`` counts as a difference and two NaNs with the
same bits count as equal, unlike ``torch.equal``. Magnitudes (max / mean |d|) are reported alongside.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import torch
from torch import Tensor

from ..hashing import tensor_digest

__all__ = ["ParityReport", "ParityStructureError", "compare_outputs", "measure_parity"]

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class ParityStructureError(ValueError):
    """The two outputs cannot be compared element-wise (different nesting, length, keys or shapes)."""


@dataclass(frozen=True)
class ParityReport:
    """Result of comparing two outputs (a tensor or a nest of tuples/lists/dicts of tensors).

    ``bit_equal``: every tensor digest (dtype + shape + bytes) and every non-tensor leaf match.
    ``max_abs`` / ``mean_abs``: over all tensor elements, computed in float64, positions whose bits are
    equal count as 0 (so equal NaN/inf contribute 0; NaN against a number gives ``nan``).
    ``n_differ``: elements whose bits differ (value comparison when dtypes differ), plus differing
    non-tensor leaves. ``numel``: total tensor elements compared. ``digest_baseline`` /
    ``digest_optimized``: one SHA-256 over the leaf digests in order. ``baseline_s`` /
    ``optimized_s``: wall seconds of each call (``None`` from :func:`compare_outputs`).
    """

    bit_equal: bool
    max_abs: float
    mean_abs: float
    n_differ: int
    numel: int
    label: str = ""
    n_tensors: int = 0
    digest_baseline: str = ""
    digest_optimized: str = ""
    baseline_s: float | None = None
    optimized_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain-JSON-serialisable dict of all fields."""
        return asdict(self)

    def as_text(self) -> str:
        """One line, e.g. ``fused-qkv: NOT bit-equal, 385/3932160 differ (0.0098%), max|d| 7.8e-03, mean|d| 7.6e-07``."""
        head = f"{self.label}: " if self.label else ""
        if self.bit_equal:
            body = f"bit-equal ({self.numel} elements, {self.n_tensors} tensor(s), digest {self.digest_baseline[:12]})"
        else:
            pct = 100.0 * self.n_differ / self.numel if self.numel else 0.0
            body = (
                f"NOT bit-equal, {self.n_differ}/{self.numel} differ ({pct:.4g}%), "
                f"max|d| {self.max_abs:.3g}, mean|d| {self.mean_abs:.3g}"
            )
        if self.baseline_s is not None and self.optimized_s is not None:
            body += f"; baseline {self.baseline_s * 1e3:.2f} ms, optimized {self.optimized_s * 1e3:.2f} ms"
        return head + body


def _leaves(x: Any, path: str, out: list[tuple[str, Any]]) -> None:
    if isinstance(x, Tensor):
        out.append((path, x))
    elif isinstance(x, (tuple, list)):
        out.append((f"{path}<{type(x).__name__}:{len(x)}>", _Marker()))
        for i, item in enumerate(x):
            _leaves(item, f"{path}[{i}]", out)
    elif isinstance(x, dict):
        keys = list(x.keys())
        out.append((f"{path}<dict:{keys!r}>", _Marker()))
        for key in keys:
            _leaves(x[key], f"{path}[{key!r}]", out)
    else:
        out.append((path, x))


class _Marker:
    """Structure placeholder: equal to any other marker (the path carries the structure)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Marker)

    def __hash__(self) -> int:
        return 0


def _bits_differ(a: Tensor, b: Tensor) -> Tensor:
    """Bool mask of positions whose bits differ (same shape required)."""
    if a.dtype == b.dtype:
        if a.dtype == torch.bool:
            return a != b
        size = a.element_size()
        if a.is_complex():
            a, b = torch.view_as_real(a), torch.view_as_real(b)
            size = a.element_size()
            ne = a.contiguous().view(_INT_VIEW[size]) != b.contiguous().view(_INT_VIEW[size])
            return ne.any(dim=-1)
        return a.contiguous().view(_INT_VIEW[size]) != b.contiguous().view(_INT_VIEW[size])
    return a.to(torch.complex128 if (a.is_complex() or b.is_complex()) else torch.float64) != b.to(
        torch.complex128 if (a.is_complex() or b.is_complex()) else torch.float64
    )


def compare_outputs(a: Any, b: Any, *, label: str = "") -> ParityReport:
    """Compare two already-computed outputs (tensor, or nested tuple/list/dict of tensors and plain values).

    Tensors are moved to CPU for the comparison; the inputs are not modified. Raises
    :class:`ParityStructureError` (a ``ValueError``) when the nesting, lengths, keys or a pair of tensor
    shapes differ (message gives the path and both shapes). Tensors of equal shape but different dtype
    are compared by value and are never ``bit_equal``.
    """
    la: list[tuple[str, Any]] = []
    lb: list[tuple[str, Any]] = []
    _leaves(a, "out", la)
    _leaves(b, "out", lb)
    if [p for p, _ in la] != [p for p, _ in lb]:
        raise ParityStructureError(
            f"output structures differ: {[p for p, _ in la][:8]} vs {[p for p, _ in lb][:8]}"
        )
    h_a, h_b = hashlib.sha256(), hashlib.sha256()
    bit_equal, n_differ, numel, n_tensors = True, 0, 0, 0
    max_abs, sum_abs = 0.0, 0.0
    for (path, x), (_, y) in zip(la, lb):
        if isinstance(x, Tensor) != isinstance(y, Tensor):
            raise ParityStructureError(f"{path}: tensor vs {type(y if isinstance(x, Tensor) else x).__name__}")
        if not isinstance(x, Tensor):
            same = bool(x == y)
            h_a.update(repr(x).encode())
            h_b.update(repr(y).encode())
            if not same:
                bit_equal = False
                n_differ += 1
            continue
        if tuple(x.shape) != tuple(y.shape):
            raise ParityStructureError(
                f"{path}: shapes differ: {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}"
            )
        x, y = x.detach().cpu(), y.detach().cpu()
        da, db = tensor_digest(x), tensor_digest(y)
        h_a.update(da.encode())
        h_b.update(db.encode())
        n_tensors += 1
        numel += x.numel()
        if da == db:
            continue
        bit_equal = False
        mask = _bits_differ(x, y)
        n_differ += int(mask.sum())
        if x.numel():
            diff = (x.to(torch.complex128 if x.is_complex() else torch.float64)
                    - y.to(torch.complex128 if y.is_complex() else torch.float64)).abs()
            diff = torch.where(mask, diff, torch.zeros_like(diff))
            m = float(diff.max())
            max_abs = m if math.isnan(m) or math.isnan(max_abs) else max(max_abs, m)
            sum_abs += float(diff.sum())
    return ParityReport(
        bit_equal=bit_equal,
        max_abs=max_abs,
        mean_abs=sum_abs / numel if numel else 0.0,
        n_differ=n_differ,
        numel=numel,
        label=label,
        n_tensors=n_tensors,
        digest_baseline=h_a.hexdigest(),
        digest_optimized=h_b.hexdigest(),
    )


def measure_parity(
    baseline: Callable[..., Any], optimized: Callable[..., Any], *args: Any, label: str = "", **kwargs: Any
) -> ParityReport:
    """Call ``baseline(*args, **kwargs)`` then ``optimized(*args, **kwargs)``, each under
    ``torch.inference_mode()``, and compare their outputs with :func:`compare_outputs`.

    ``label`` is reserved (not passed on). Inputs are passed as-is to both calls: a callable that
    mutates its inputs in place affects the second call. Timings are wall seconds of one call each
    (first-call effects included, CUDA synchronised), recorded as ``baseline_s`` / ``optimized_s``. Raises whatever the
    callables raise, and :class:`ParityStructureError` for incomparable outputs.
    """
    with torch.inference_mode():
        t0 = time.perf_counter()
        out_a = baseline(*args, **kwargs)
        _sync()
        t1 = time.perf_counter()
        out_b = optimized(*args, **kwargs)
        _sync()
        t2 = time.perf_counter()
    report = compare_outputs(out_a, out_b, label=label)
    return replace(report, baseline_s=t1 - t0, optimized_s=t2 - t1)


def _sync() -> None:
    """Wait for queued CUDA work so timings are real (no-op when CUDA was never initialised)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
