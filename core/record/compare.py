"""Honest comparison of outputs: bit identity first, then how large the difference is.

:func:`compare` takes two ComfyUI images or latents (PSNR, pixels differing, :func:`diff_heatmap`);
:func:`compare_outputs` takes any two model outputs (a tensor or a nest of tuples/lists/dicts).

``identical`` is decided by the raw bytes (the same criterion as the digests in ``hashing``), never by
a tolerance. The size of a difference is measured in float64:

* ``max_abs`` / ``mean_abs`` / MSE for PSNR ignore positions where ``|a - b|`` is NaN (NaN in either
  input, or ``inf - inf``); such positions that differ by bytes are counted in ``n_nan_diff``.
  ``inf`` vs a finite value gives ``max_abs = inf``.
* ``pct_values_differ`` / ``pct_pixels_differ`` count *bytes*-different elements, so ``-0.0`` vs
  ``0.0`` counts as a difference (with ``|d| = 0``) and two identical NaNs do not.
* PSNR in dB: images on the [0,1] scale (peak 1); latents have no fixed range, so the peak is the
  reference ``a``'s largest finite ``|value|`` (``psnr_peak`` records it). ``inf`` when the MSE is 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

__all__ = [
    "CompareReport",
    "CompareShapeError",
    "ParityReport",
    "bits_differ",
    "compare",
    "compare_outputs",
    "diff_heatmap",
]

Kind = Literal["image", "latent"]
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class CompareShapeError(ValueError):
    """The two values cannot be compared: different shapes or dtypes (both are in the message), or, for
    :func:`compare_outputs`, different nesting, lengths or keys (the message gives the path)."""


@dataclass(frozen=True)
class CompareReport:
    """Result of :func:`compare`. Percentages are 0-100; ``psnr`` is in dB (``inf`` when equal)."""

    kind: str
    identical: bool
    max_abs: float
    mean_abs: float
    pct_values_differ: float
    pct_pixels_differ: float
    psnr: float
    psnr_peak: float
    n_values_differ: int
    n_nan_diff: int
    shape: tuple[int, ...]
    dtype: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe dict (strict JSON has no inf/NaN: non-finite floats become "inf"/"-inf"/"nan")."""
        d = asdict(self)
        d["shape"] = list(self.shape)
        for key, value in d.items():
            if isinstance(value, float) and not math.isfinite(value):
                d[key] = str(value)
        return d

    def as_text(self) -> str:
        """One human-readable paragraph."""
        if self.identical:
            head = f"IDENTICAL (bit-exact) {self.kind} {list(self.shape)} {self.dtype}"
            return head
        lines = [
            f"DIFFERENT {self.kind} {list(self.shape)} {self.dtype}",
            f"values differ: {self.n_values_differ} ({self.pct_values_differ:.4g}%), "
            f"pixels differ: {self.pct_pixels_differ:.4g}%",
            f"max |d| = {self.max_abs:.6g}, mean |d| = {self.mean_abs:.6g}, "
            f"PSNR = {self.psnr:.2f} dB (peak {self.psnr_peak:.4g})",
        ]
        if self.n_nan_diff:
            lines.append(f"{self.n_nan_diff} differing values involve NaN (excluded from |d| stats)")
        return "\n".join(lines)


def _validate(a: torch.Tensor, b: torch.Tensor, kind: str) -> None:
    if kind not in ("image", "latent"):
        raise ValueError(f"kind must be 'image' or 'latent', got {kind!r}")
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError("compare() takes two torch.Tensors")
    if a.shape != b.shape or a.dtype != b.dtype:
        raise CompareShapeError(
            f"cannot compare {kind}s: a is {tuple(a.shape)} {a.dtype}, b is {tuple(b.shape)} {b.dtype}"
        )
    if kind == "image" and a.ndim != 4:
        raise ValueError(f"image must be 4-D [B,H,W,C], got {tuple(a.shape)}")
    if kind == "latent" and a.ndim < 2:
        raise ValueError(f"latent must have a channel dim [B,C,...], got {tuple(a.shape)}")


def bits_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bool mask (shape of ``a``), True where the two elements differ.

    Same dtype: the elements' bit patterns are compared (``-0.0`` vs ``0.0`` differs, equal NaN bits
    do not); complex elements differ when either part's bits do. Different dtypes: compared by value
    in float64 / complex128. Any layout and device; ``a`` and ``b`` must have the same shape.
    """
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.dtype != b.dtype:
        wide = torch.complex128 if (a.is_complex() or b.is_complex()) else torch.float64
        return a.to(wide) != b.to(wide)
    if a.dtype == torch.bool:
        return a != b
    if a.is_complex():
        return bits_differ(torch.view_as_real(a), torch.view_as_real(b)).any(dim=-1)
    view = _INT_VIEW[a.element_size()]
    return a.view(view) != b.view(view)


def _pixel_mask(mask: torch.Tensor, kind: str) -> torch.Tensor:
    return mask.any(dim=-1) if kind == "image" else mask.any(dim=1)


def compare(a: torch.Tensor, b: torch.Tensor, *, kind: Kind = "image") -> CompareReport:
    """Compare ``a`` (reference) with ``b``.

    Args:
        a, b: same shape and dtype, any device (copied to the CPU). ``kind="image"``: ComfyUI IMAGE
            ``[B,H,W,C]`` in [0,1]; a pixel is one ``(b,h,w)`` position. ``kind="latent"``:
            ``[B,C,...]`` (4-D, 5-D video, ...); a pixel is one position over the channel dim 1.
    Returns:
        :class:`CompareReport` (see the module docstring for the NaN / -0.0 / PSNR conventions).
    Raises:
        CompareShapeError: shapes or dtypes differ. ValueError: bad ``kind`` or rank.
        TypeError: not tensors.
    """
    _validate(a, b, kind)
    a = a.detach().cpu().contiguous()
    b = b.detach().cpu().contiguous()
    numel = a.numel()
    shape, dtype = tuple(a.shape), str(a.dtype)
    mask = bits_differ(a, b)
    n_diff = int(mask.sum())
    if n_diff == 0:
        peak = 1.0 if kind == "image" else _latent_peak(a)
        return CompareReport(kind, True, 0.0, 0.0, 0.0, 0.0, math.inf, peak, 0, 0, shape, dtype)
    d = (a.to(torch.float64) - b.to(torch.float64)).abs() if not a.is_complex() else (a - b).abs().double()
    nan = torch.isnan(d)
    n_nan_diff = int((nan & mask).sum())
    valid = d[~nan]
    max_abs = float(valid.max()) if valid.numel() else math.nan
    mean_abs = float(valid.mean()) if valid.numel() else math.nan
    mse = float((valid * valid).mean()) if valid.numel() else math.nan
    peak = 1.0 if kind == "image" else _latent_peak(a)
    psnr = _psnr(mse, peak)
    pixels = _pixel_mask(mask, kind)
    return CompareReport(
        kind=kind,
        identical=False,
        max_abs=max_abs,
        mean_abs=mean_abs,
        pct_values_differ=100.0 * n_diff / numel,
        pct_pixels_differ=100.0 * int(pixels.sum()) / pixels.numel(),
        psnr=psnr,
        psnr_peak=peak,
        n_values_differ=n_diff,
        n_nan_diff=n_nan_diff,
        shape=shape,
        dtype=dtype,
    )


def _latent_peak(a: torch.Tensor) -> float:
    x = a.abs().double() if a.is_complex() else a.double().abs()
    x = x[torch.isfinite(x)]
    peak = float(x.max()) if x.numel() else 0.0
    return peak if peak > 0 else 1.0


def _psnr(mse: float, peak: float) -> float:
    if math.isnan(mse):
        return math.nan
    if mse == 0:
        return math.inf
    if math.isinf(mse):
        return -math.inf
    return 10.0 * math.log10(peak * peak / mse)


def _colormap(v: torch.Tensor) -> torch.Tensor:
    """[N,H,W] in [0,1] -> [N,H,W,3]: black -> red (0.5) -> yellow (1.0)."""
    r = (2 * v).clamp(0, 1)
    g = (2 * v - 1).clamp(0, 1)
    return torch.stack([r, g, torch.zeros_like(v)], dim=-1).to(torch.float32)


def diff_heatmap(a: torch.Tensor, b: torch.Tensor, *, kind: Kind, normalize: bool | None = None) -> torch.Tensor:
    """Where ``a`` and ``b`` differ, as a ComfyUI IMAGE ``[N,H,W,3]`` float32 in [0,1].

    The intensity is ``mean |a - b|`` over channels (the last dim of an image, dim 1 of a latent),
    shown black -> red -> yellow. Images: ``N = B``; latents ``[B,C,H,W]``: ``N = B``; video latents
    ``[B,C,T,H,W]``: ``N = B*T`` (frames stacked batch-major). NaN differences are drawn at full
    intensity; everything else is scaled by the largest finite difference when ``normalize``
    (default: True for latents, which have no fixed range; False for images, whose [0,1] scale is
    already absolute) and clipped to [0,1]. Identical inputs give all zeros.

    Raises:
        CompareShapeError / ValueError / TypeError: as :func:`compare`; ValueError for a latent that
        is not 4-D or 5-D.
    """
    _validate(a, b, kind)
    if kind == "latent" and a.ndim not in (4, 5):
        raise ValueError(f"heatmap needs a 4-D or 5-D latent, got {tuple(a.shape)}")
    a = a.detach().cpu()
    b = b.detach().cpu()
    if a.is_complex():
        raise TypeError("diff_heatmap does not support complex tensors")
    d = (a.to(torch.float64) - b.to(torch.float64)).abs()
    if kind == "image":
        per_pixel = d.mean(dim=-1)
    else:
        per_pixel = d.mean(dim=1)
        if per_pixel.ndim == 4:  # [B,T,H,W] -> [B*T,H,W]
            per_pixel = per_pixel.reshape(-1, *per_pixel.shape[-2:])
    nan = torch.isnan(per_pixel)
    per_pixel = torch.where(nan, torch.zeros_like(per_pixel), per_pixel)
    if normalize is None:
        normalize = kind == "latent"
    finite = per_pixel[torch.isfinite(per_pixel)]
    top = float(finite.max()) if finite.numel() else 0.0
    if normalize and top > 0:
        per_pixel = per_pixel / top
    per_pixel = torch.where(torch.isinf(per_pixel), torch.ones_like(per_pixel), per_pixel)
    per_pixel = torch.where(nan, torch.ones_like(per_pixel), per_pixel).clamp(0, 1)
    return _colormap(per_pixel).contiguous()


@dataclass(frozen=True)
class ParityReport:
    """Result of :func:`compare_outputs`.

    ``bit_equal``: every tensor's dtype, shape and bytes and every non-tensor leaf match.
    ``max_abs`` / ``mean_abs``: over all tensor elements, in float64; positions whose bits are equal
    count as 0 (so equal NaN/inf contribute 0; NaN against a number gives ``nan``). ``n_differ``:
    elements that differ (:func:`bits_differ`) plus differing non-tensor leaves. ``numel``: tensor
    elements compared; ``n_tensors``: tensors compared.
    """

    bit_equal: bool
    max_abs: float
    mean_abs: float
    n_differ: int
    numel: int
    label: str = ""
    n_tensors: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Plain dict of all fields (``max_abs`` may be ``nan``)."""
        return asdict(self)

    def as_text(self) -> str:
        """One line, e.g.
        ``fused-qkv: NOT bit-equal, 385/3932160 differ (0.0098%), max|d| 7.8e-03, mean|d| 7.6e-07``."""
        head = f"{self.label}: " if self.label else ""
        if self.bit_equal:
            return head + f"bit-equal ({self.numel} elements, {self.n_tensors} tensor(s))"
        pct = 100.0 * self.n_differ / self.numel if self.numel else 0.0
        return head + (
            f"NOT bit-equal, {self.n_differ}/{self.numel} differ ({pct:.4g}%), "
            f"max|d| {self.max_abs:.3g}, mean|d| {self.mean_abs:.3g}"
        )


def _leaves(x: Any, path: str, out: list[tuple[str, Any]]) -> None:
    """Flatten ``x`` into ``(path, leaf)`` pairs; containers add a ``(path<type:len>, None)`` marker."""
    if isinstance(x, torch.Tensor):
        out.append((path, x))
    elif isinstance(x, (tuple, list)):
        out.append((f"{path}<{type(x).__name__}:{len(x)}>", None))
        for i, item in enumerate(x):
            _leaves(item, f"{path}[{i}]", out)
    elif isinstance(x, dict):
        out.append((f"{path}<dict:{list(x)!r}>", None))
        for key, item in x.items():
            _leaves(item, f"{path}[{key!r}]", out)
    else:
        out.append((path, x))


def compare_outputs(a: Any, b: Any, *, label: str = "") -> ParityReport:
    """Compare two model outputs: a tensor, or nested tuples/lists/dicts of tensors and plain values.

    Tensors of any device and layout are compared on the CPU by bytes (:func:`bits_differ`); the inputs
    are not modified. Equal shapes with different dtypes are compared by value and are never
    ``bit_equal``. ``label`` only names the report.

    Raises:
        CompareShapeError: the nesting, lengths, keys or a pair of tensor shapes differ (the message
            gives the path and both shapes).
    """
    la: list[tuple[str, Any]] = []
    lb: list[tuple[str, Any]] = []
    _leaves(a, "out", la)
    _leaves(b, "out", lb)
    if [p for p, _ in la] != [p for p, _ in lb]:
        raise CompareShapeError(f"output structures differ: {[p for p, _ in la][:8]} vs {[p for p, _ in lb][:8]}")
    bit_equal, n_differ, numel, n_tensors = True, 0, 0, 0
    max_abs, sum_abs = 0.0, 0.0
    for (path, x), (_, y) in zip(la, lb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            raise CompareShapeError(f"{path}: tensor vs {type(y if isinstance(x, torch.Tensor) else x).__name__}")
        if not isinstance(x, torch.Tensor):
            if x != y:
                bit_equal, n_differ = False, n_differ + 1
            continue
        if x.shape != y.shape:
            raise CompareShapeError(f"{path}: shapes differ: {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}")
        n_tensors += 1
        numel += x.numel()
        mask = bits_differ(x, y)
        n = int(mask.sum())
        if n == 0 and x.dtype == y.dtype:
            continue
        bit_equal, n_differ = False, n_differ + n
        if n:
            wide = torch.complex128 if (x.is_complex() or y.is_complex()) else torch.float64
            diff = (x.detach().cpu().to(wide) - y.detach().cpu().to(wide)).abs()
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
    )
