"""Exact content digests of tensors, latents and images.

A digest is SHA-256 over a ``f"{dtype}|{tuple(shape)}|"`` header followed by the tensor's raw bytes
in C order. The header matters: without it, zeros of shape (1,16,128,128) and (1,32,64,128), or fp32
and fp16 zeros of matching byte size, hash the same (``tests/core/test_hashing.py``). Digests are
*bit* identity, which is not ``torch.equal``: ``0.0`` and ``-0.0`` hash differently, and two NaNs with
the same bit pattern hash the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "HashCheck",
    "HashResult",
    "check_expected",
    "hash_image",
    "hash_inputs",
    "hash_latent",
    "image_to_uint8",
    "is_sha256",
    "hash_reference",
    "short",
    "tensor_bytes",
    "tensor_digest",
]

#: Shortest hex prefix :func:`check_expected` accepts (48 bits: a chance match is ~3.6e-15).
MIN_PREFIX = 12
_HEX = frozenset("0123456789abcdef")


def is_sha256(text: object) -> bool:
    """Whether ``text`` is a full SHA-256 as the pack writes it: 64 lower-case hex characters."""
    return isinstance(text, str) and len(text) == 64 and _HEX.issuperset(text)


def hash_reference(text: str | None, what: str = "expected", required: bool = False) -> str:
    """The one rule for a hash a user gives to compare against: ``text`` stripped and lower-cased, which must be a
    hex SHA-256 (64 characters) or a prefix of at least :data:`MIN_PREFIX` of them (a shorter prefix would call
    unrelated outputs identical). ``""`` for an empty or missing ``text`` unless ``required``.

    Args:
        text: the given hash, any case, surrounding whitespace ignored.
        what: the name of the input, for the error message.
        required: an empty ``text`` is refused too.
    Returns:
        the normalised hash or prefix, or ``""``.
    Raises:
        ValueError: not hex, shorter than :data:`MIN_PREFIX` or longer than 64 characters (or empty, ``required``).
    """
    ref = (text or "").strip().lower()
    if (ref or required) and not (MIN_PREFIX <= len(ref) <= 64 and _HEX.issuperset(ref)):
        raise ValueError(
            f"{what} must be a hex SHA-256 (64 characters) or a prefix of at least {MIN_PREFIX} "
            f"characters, got {text!r}"
        )
    return ref


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The tensor's raw bytes in C (row-major) order, as a 1-D ``uint8`` NumPy array.

    Works for every dense dtype (bf16, fp8, bool, complex ... via a ``uint8`` view), any memory
    layout (channels_last, transposed views: made contiguous first), tensors that require grad,
    and tensors on any device (copied to the CPU). Byte order is the machine's (little-endian on
    x86/ARM).

    Raises:
        TypeError: ``t`` is not a dense strided ``torch.Tensor`` (sparse/quantized/meta tensors).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided or t.is_quantized or t.is_meta:
        raise TypeError(f"cannot hash a {t.layout} / quantized / meta tensor")
    flat = t.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def tensor_digest(t: torch.Tensor) -> str:
    """64-hex SHA-256 of ``f"{t.dtype}|{tuple(t.shape)}|"`` + the C-order bytes of ``t``.

    Independent of memory layout and device (a channels_last tensor hashes like its contiguous
    copy); dependent on dtype, shape and every bit (``-0.0 != 0.0``; equal NaN bit patterns match).

    Raises:
        TypeError: see :func:`tensor_bytes`.
    """
    data = tensor_bytes(t)
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(memoryview(data))
    return h.hexdigest()


def image_to_uint8(image: torch.Tensor) -> np.ndarray:
    """ComfyUI IMAGE ``[B,H,W,C]`` float in [0,1] -> ``uint8`` array ``[B,H,W,C]``, as ``SaveImage`` writes it.

    Same formula as ``nodes.py SaveImage.save_images`` (ComfyUI v0.8.0) per image:
    ``np.clip(255. * i.cpu().numpy(), 0, 255).astype(np.uint8)`` - i.e. truncation, not rounding,
    computed in the tensor's own NumPy dtype. Applying it to the whole batch at once is the same
    elementwise. Differences from SaveImage: bf16 (which NumPy lacks and SaveImage would reject) is
    converted to float32 first; the tensor is detached. NaN casts to whatever NumPy's cast gives on
    this platform (0 on x86), exactly as SaveImage would write it; the cast warning is silenced.

    Raises:
        TypeError: not a floating-point tensor. ValueError: not 4-D.
    """
    if not isinstance(image, torch.Tensor) or not image.is_floating_point():
        raise TypeError("image must be a floating-point torch.Tensor [B,H,W,C]")
    if image.ndim != 4:
        raise ValueError(f"image must be 4-D [B,H,W,C], got shape {tuple(image.shape)}")
    t = image.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    with np.errstate(invalid="ignore"):
        return np.clip(255.0 * t.numpy(), 0, 255).astype(np.uint8)


def hash_image(image: torch.Tensor, raw: bool = False) -> str:
    """Digest of a ComfyUI IMAGE ``[B,H,W,C]``.

    ``raw=False`` (default): :func:`tensor_digest` of the ``uint8`` array :func:`image_to_uint8`
    gives, i.e. of the pixels a PNG saved by ``SaveImage`` holds (header ``torch.uint8|(B, H, W, C)|``).
    ``raw=True``: :func:`tensor_digest` of the image as float32 (fp16/bf16 are widened exactly),
    which also sees sub-1/255 differences.

    Raises:
        TypeError / ValueError: as :func:`image_to_uint8`.
    """
    if raw:
        if not isinstance(image, torch.Tensor) or not image.is_floating_point():
            raise TypeError("image must be a floating-point torch.Tensor [B,H,W,C]")
        return tensor_digest(image.to(torch.float32))
    return tensor_digest(torch.from_numpy(image_to_uint8(image)))


def hash_latent(samples: torch.Tensor) -> str:
    """Digest of a LATENT's ``samples`` tensor (any shape, in its own dtype): :func:`tensor_digest`."""
    return tensor_digest(samples)


def short(h: str, n: int = 12) -> str:
    """First ``n`` hex characters of a digest, for display only (never for comparison).

    Raises: ValueError if ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return h[:n]


@dataclass(frozen=True)
class HashResult:
    """Digests of an IMAGE and/or a LATENT (``None`` where not given / not requested).

    ``primary`` is the image digest when an image was given, else the latent digest.
    """

    primary: str
    image: str | None = None
    image_raw: str | None = None
    latent: str | None = None
    image_shape: tuple[int, ...] | None = None
    latent_shape: tuple[int, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict."""
        d = asdict(self)
        for key in ("image_shape", "latent_shape"):
            if d[key] is not None:
                d[key] = list(d[key])
        return d

    def as_text(self) -> str:
        """One line per digest."""
        lines = []
        if self.image is not None:
            lines.append(f"image (uint8 as saved) {list(self.image_shape or ())}: {self.image}")
        if self.image_raw is not None:
            lines.append(f"image (raw float32): {self.image_raw}")
        if self.latent is not None:
            lines.append(f"latent {list(self.latent_shape or ())}: {self.latent}")
        return "\n".join(lines)


def hash_inputs(
    image: torch.Tensor | None = None, latent: torch.Tensor | Mapping[str, Any] | None = None, raw_float: bool = False
) -> HashResult:
    """Hash an IMAGE and/or a LATENT (a tensor or ComfyUI's ``{"samples": tensor, ...}`` dict).

    Image: :func:`hash_image` (``raw=False``), plus the raw float32 digest when ``raw_float``.
    Latent: :func:`hash_latent` of its samples.

    Raises:
        ValueError: neither given, or a LATENT dict without ``"samples"``.
        TypeError / ValueError: as :func:`hash_image`.
    """
    if image is None and latent is None:
        raise ValueError("connect an image and/or a latent to hash")
    img = img_raw = lat = None
    img_shape = lat_shape = None
    if image is not None:
        img = hash_image(image)
        img_raw = hash_image(image, raw=True) if raw_float else None
        img_shape = tuple(image.shape)
    if latent is not None:
        samples = latent
        if isinstance(latent, Mapping):
            if "samples" not in latent:
                raise ValueError("LATENT dict has no 'samples' entry")
            samples = latent["samples"]
        lat = hash_latent(samples)
        lat_shape = tuple(samples.shape)
    primary = img if img is not None else lat
    assert primary is not None
    return HashResult(
        primary=primary, image=img, image_raw=img_raw, latent=lat, image_shape=img_shape, latent_shape=lat_shape
    )


@dataclass(frozen=True)
class HashCheck:
    """Result of :func:`check_expected`. ``status`` is "match", "mismatch" or "unchecked"."""

    checked: bool
    match: bool
    status: str
    actual: str
    expected: str

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict."""
        return asdict(self)

    def as_text(self) -> str:
        """One line."""
        if not self.checked:
            return "no expected hash given"
        if self.match:  # the digest itself is on the line above: said once
            if self.expected == self.actual:
                return "MATCH: the hash equals the expected one (all 64 hex)"
            return f"MATCH: the hash starts with the expected {len(self.expected)}-hex prefix {self.expected}"
        return f"MISMATCH: expected {self.expected}, got {self.actual}"


def check_expected(actual: str, expected: str | None) -> HashCheck:
    """Compare a digest with an expected full digest or hex prefix (case and whitespace ignored).

    Empty ``expected`` -> ``status="unchecked"``. A prefix must have at least :data:`MIN_PREFIX`
    hex characters; it matches when ``actual`` starts with it.

    Raises:
        ValueError: ``expected`` is not hex, is shorter than :data:`MIN_PREFIX` or longer than 64.
    """
    exp = hash_reference(expected)
    act = actual.strip().lower()
    if not exp:
        return HashCheck(checked=False, match=False, status="unchecked", actual=act, expected="")
    match = act.startswith(exp)
    return HashCheck(checked=True, match=match, status="match" if match else "mismatch", actual=act, expected=exp)
