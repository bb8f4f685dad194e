"""Graded verdicts where bits cannot match: identical bytes / same picture within tolerance / different picture.

A pinned Hash node carries, next to the expected hash, a small *reference* of its output: the output's full
shape, a low-resolution float16 thumbnail (area-averaged to at most :data:`THUMB_SIDE` px a side for an IMAGE,
the same number of values per item for a LATENT) of its first :data:`MAX_ITEMS` batch items (2 KB of JSON per
item), and a SHA-256 of each later item's bytes. When the bytes differ, the output's own reference is compared
with it, item by item:

- ``identical``: the same hash (the thumbnail is not needed);
- ``same_picture``: every item is graded and the worst item's thumbnail PSNR is >= :data:`SAME_PICTURE_PSNR_DB`
  (IMAGE: peak 1.0; LATENT: the reference item's largest |value|), reported with PSNR, max |delta| and the
  run-record fields that differ; a later item (no thumbnail) counts only when its bytes are identical;
- ``different_picture``: an item below the threshold, or the full shape (size, batch, channels) differs;
- ``ungraded``: the thumbnailed items are the same picture but a later item's bytes differ, and it has no
  thumbnail to grade it by: never reported as the same picture;
- ``unknown``: the bytes differ and there is no reference to grade by.

The threshold was measured from honest cross-setting runs of the determinism-check workflow on this project's
machine (``docs/reproducing.md``, section "Tolerance"): CPU-setting variants (oneDNN ISA cap, MKL branch, ATen
capability, thread count) and precision variants stay far above it, and a different seed falls far below it.
This module imports nothing from ComfyUI.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .hashing import hash_reference

__all__ = [
    "THUMB_SIDE",
    "MAX_ITEMS",
    "SAME_PICTURE_PSNR_DB",
    "LEVELS",
    "EXIT_CODES",
    "Verdict",
    "thumbnail",
    "decode_thumbnail",
    "grade",
    "grade_tensors",
    "parse_reference",
    "check_hash",
]

THUMB_SIDE = 16
MAX_ITEMS = 4
#: PSNR (dB) of the thumbnails at or above which a differing output is "the same picture"; the runs that set it
#: and their margins: docs/reproducing.md section 6.
SAME_PICTURE_PSNR_DB = 30.0
LEVELS = ("identical", "same_picture", "different_picture", "ungraded", "unknown")
#: ``steadfast run`` exit code per level (2 = unusable is the runner's own): only identical bytes pass (0), the
#: same picture within tolerance is 3, and every outcome that cannot claim the same picture is 1.
EXIT_CODES = {"identical": 0, "same_picture": 3, "different_picture": 1, "ungraded": 1, "unknown": 1}
_FORMAT = "steadfast-thumb/1"


def _as_nchw(t: torch.Tensor, kind: str) -> torch.Tensor:
    t = t.detach().to("cpu", torch.float32)
    if kind == "image":  # ComfyUI IMAGE [B,H,W,C]
        if t.ndim != 4:
            raise ValueError(f"an IMAGE thumbnail needs [B,H,W,C], got shape {tuple(t.shape)}")
        return t.permute(0, 3, 1, 2)
    if t.ndim == 5:  # video latent [B,C,T,H,W]: frames side by side in time order on the batch axis
        t = t.permute(0, 2, 1, 3, 4).reshape(-1, t.shape[1], t.shape[3], t.shape[4])
    if t.ndim != 4:
        raise ValueError(f"a LATENT thumbnail needs [B,C,H,W] or [B,C,T,H,W], got shape {tuple(t.shape)}")
    return t


def thumbnail(t: torch.Tensor, kind: str = "image", max_items: int | None = MAX_ITEMS) -> dict[str, Any]:
    """A few-KB float16 reference of ``t`` (area-averaged, at most :data:`THUMB_SIDE` px a side for an IMAGE).

    Args:
        t: a ComfyUI IMAGE ``[B,H,W,C]`` (``kind="image"``) or LATENT samples ``[B,C,H,W]`` / ``[B,C,T,H,W]``
            (a video latent's frames count as items).
        kind: "image" or "latent".
        max_items: items that get a thumbnail (None: all); each later item gets the SHA-256 of its bytes.

    Returns:
        JSON-safe dict: ``format``, ``kind``, ``shape`` (of ``t``), ``thumb_shape`` (NCHW), ``data`` (base64 of
        little-endian float16) and, only when ``t`` has more items than ``max_items``, ``item_digests``: the
        hex SHA-256 of each later item's float32 bytes, in order.

    Raises:
        ValueError: a bad ``kind`` or rank.
    """
    if kind not in ("image", "latent"):
        raise ValueError(f"thumbnail kind must be 'image' or 'latent', got {kind!r}")
    full = _as_nchw(t.detach().cpu(), kind)  # on the CPU first: the same thumbnail from any device
    x = full if max_items is None else full[:max_items]
    rest = [
        hashlib.sha256(item.contiguous().numpy().astype("<f4").tobytes()).hexdigest() for item in full[x.shape[0] :]
    ]
    h, w = x.shape[-2:]
    # the same budget per item as an RGB thumbnail: 3 * THUMB_SIDE**2 values (a 16-channel latent gets 8 px)
    side = THUMB_SIDE if kind == "image" else max(4, int(math.sqrt(3 * THUMB_SIDE**2 / max(1, x.shape[1]))))
    scale = max(h, w) / side
    if scale > 1:
        x = F.adaptive_avg_pool2d(x.double(), (max(1, round(h / scale)), max(1, round(w / scale)))).float()
    data = x.to(torch.float16).contiguous().numpy().astype("<f2").tobytes()
    out = {
        "format": _FORMAT,
        "kind": kind,
        "shape": list(t.shape),
        "thumb_shape": list(x.shape),
        "data": base64.b64encode(data).decode("ascii"),
    }
    if rest:  # only then: a reference of a batch within MAX_ITEMS stays as it was before this key existed
        out["item_digests"] = rest
    return out


def decode_thumbnail(ref: Mapping[str, Any]) -> torch.Tensor:
    """The thumbnail tensor (float64, NCHW) of a :func:`thumbnail` dict. Raises ValueError for another format."""
    if ref.get("format") != _FORMAT:
        raise ValueError(f"not a Steadfast reference thumbnail (format {ref.get('format')!r}, want {_FORMAT})")
    arr = np.frombuffer(base64.b64decode(ref["data"]), dtype="<f2").astype(np.float64)
    return torch.from_numpy(arr.reshape(ref["thumb_shape"]).copy())


def parse_reference(text: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A reference from a node input or a record: the dict, its JSON text, or None/"" (no reference).

    Raises:
        ValueError: text that is not a JSON thumbnail.
    """
    import json

    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    ref = dict(text) if isinstance(text, Mapping) else json.loads(text)
    if not isinstance(ref, dict) or ref.get("format") != _FORMAT:
        raise ValueError(f"expected_reference is not a Steadfast reference thumbnail ({_FORMAT})")
    return ref


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One graded verdict: ``level`` (:data:`LEVELS`), ``psnr`` (dB, thumbnails), ``max_abs`` (thumbnails),
    ``threshold_db``, ``env_diffs`` (run-record fields that differ, as text) and ``why`` (one line)."""

    level: str
    psnr: float | None = None
    max_abs: float | None = None
    threshold_db: float = SAME_PICTURE_PSNR_DB
    env_diffs: tuple[str, ...] = ()
    why: str = ""

    @property
    def exit_code(self) -> int:
        """``steadfast run``'s exit code for this level (:data:`EXIT_CODES`)."""
        return EXIT_CODES[self.level]

    def as_text(self, env: bool = True) -> str:
        """One headline, then the measured figures and (``env``) the differing environment fields.

        Args:
            env: list the differing run-record fields (off where the caller already shows the explanation).

        Returns:
            The text, one item a line.
        """
        head = {
            "identical": "IDENTICAL BYTES",
            "same_picture": "SAME PICTURE within tolerance (bytes differ)",
            "different_picture": "DIFFERENT PICTURE",
            "ungraded": "UNGRADED: bytes differ in items the reference has no thumbnail for",
            "unknown": "bytes differ; no reference to grade by",
        }[self.level]
        lines = [head]
        if self.psnr is not None:
            psnr = "inf" if math.isinf(self.psnr) else f"{self.psnr:.1f}"
            what = "the graded items" if self.level == "ungraded" else "reference thumbnail"
            lines.append(
                f"  PSNR {psnr} dB vs {what} (same picture at >= {self.threshold_db:g} dB), "
                f"max |delta| {self.max_abs:.3g} (both on float16 thumbnails, at most {THUMB_SIDE} px a side)"
            )
        if self.why:
            lines.append("  " + self.why)
        lines += [f"  env differs: {d}" for d in self.env_diffs[:12]] if env else []
        return "\n".join(lines)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        """The verdict :meth:`as_dict` wrote (e.g. a Hash node's, read back from ComfyUI's history).

        Raises:
            ValueError: an unknown level.
        """
        if d.get("level") not in LEVELS:
            raise ValueError(f"unknown verdict level {d.get('level')!r}")
        psnr = d.get("psnr")
        return cls(
            d["level"],
            float(psnr) if psnr is not None else None,
            d.get("max_abs"),
            float(d.get("threshold_db", SAME_PICTURE_PSNR_DB)),
            tuple(d.get("env_diffs") or ()),
            d.get("why", ""),
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe dict (infinite PSNR as the string "inf")."""
        d = dataclasses.asdict(self)
        d["env_diffs"] = list(self.env_diffs)
        if self.psnr is not None and not math.isfinite(self.psnr):
            d["psnr"] = str(self.psnr)
        d["exit_code"] = self.exit_code
        return d


def _env_diffs(record_ref: Any, record_now: Any) -> tuple[str, ...]:
    if not record_ref or not record_now:
        return ()
    from .explain import explain

    try:
        return tuple(d.as_text() for d in explain(record_ref, record_now).diffs)
    except ValueError:
        return ()


def check_hash(hash_ref: str) -> str:
    """``hash_ref`` normalised (lower case, stripped) if it is a hex SHA-256 or a prefix of at least
    :data:`core.record.hashing.MIN_PREFIX` hex characters.

    Raises:
        ValueError: anything else (a shorter prefix would call unrelated outputs "identical bytes").
    """
    return hash_reference(hash_ref, "a reference hash", required=True)


def _span(first: int, last: int) -> str:
    """1-based "item 5" / "items 5-6" for the 0-based indices ``first``..``last``."""
    return f"item {first + 1}" if first == last else f"items {first + 1}-{last + 1}"


def grade(
    hash_now: str,
    hash_ref: str,
    thumb_now: Mapping[str, Any] | None,
    thumb_ref: Mapping[str, Any] | None,
    *,
    record_now: Any = None,
    record_ref: Any = None,
    threshold_db: float = SAME_PICTURE_PSNR_DB,
) -> Verdict:
    """Grade an output against a reference: its full shape, then every item (a thumbnail each, or for items past
    the thumbnailed ones the SHA-256 of their bytes).

    Args:
        hash_now / hash_ref: the output's hash and the reference hash (a prefix of >= ``MIN_PREFIX`` hex
            matches too).
        thumb_now / thumb_ref: :func:`thumbnail` dicts (either may be None: then only "identical" or "unknown").
        record_now / record_ref: run records (dicts or JSON) whose differing fields are listed.
        threshold_db: PSNR at or above which the outputs are the same picture.

    Returns:
        :class:`Verdict`: "different_picture" when the full shapes differ; "ungraded" when a later item's bytes
        differ (no thumbnail to grade it by) and no thumbnailed item is a different picture.

    Raises:
        ValueError: ``hash_ref`` shorter than ``MIN_PREFIX`` or not hex (:func:`check_hash`); a thumbnail of
            another format.
    """
    ref = check_hash(hash_ref)
    if hash_now.strip().lower().startswith(ref):
        return Verdict("identical", math.inf, 0.0, threshold_db)
    env = _env_diffs(record_ref, record_now)
    if thumb_now is None or thumb_ref is None:
        return Verdict(
            "unknown",
            None,
            None,
            threshold_db,
            env,
            "pin the reference thumbnail (expected_reference) to tell a near-identical picture from another one",
        )
    if thumb_ref.get("kind") != thumb_now.get("kind"):
        return Verdict(
            "different_picture",
            None,
            None,
            threshold_db,
            env,
            f"kind differs: {thumb_ref.get('kind')} -> {thumb_now.get('kind')}",
        )
    if list(thumb_ref.get("shape") or ()) != list(thumb_now.get("shape") or ()):
        return Verdict(
            "different_picture",
            None,
            None,
            threshold_db,
            env,
            f"shape differs: {thumb_ref.get('shape')} -> {thumb_now.get('shape')}",
        )
    a, b = decode_thumbnail(thumb_ref), decode_thumbnail(thumb_now)
    if a.shape[1:] != b.shape[1:] or min(a.shape[0], b.shape[0]) == 0:
        return Verdict(
            "different_picture",
            None,
            None,
            threshold_db,
            env,
            f"thumbnail shape differs: {list(a.shape)} -> {list(b.shape)}",
        )
    n = min(a.shape[0], b.shape[0])  # the same full shape thumbnailed with another item count: the common items
    graded = _grade_arrays(a[:n], b[:n], thumb_ref.get("kind", "image"), threshold_db, env)
    total = _item_count(thumb_ref)
    if graded.level == "different_picture" or total <= n:
        return graded
    # items past the thumbnails: identical bytes, or not graded at all
    d_ref, d_now = _digests(thumb_ref), _digests(thumb_now)
    differ = [i for i in range(n, total) if d_ref.get(i) is None or d_ref.get(i) != d_now.get(i)]
    if not differ:
        why = f"{_span(n, total - 1)} of {total}: identical bytes"
        return dataclasses.replace(graded, why="; ".join(x for x in (graded.why, why) if x))
    return Verdict(
        "ungraded",
        graded.psnr,
        graded.max_abs,
        threshold_db,
        env,
        f"{_span(0, n - 1)} of {total} graded: {graded.level.replace('_', ' ')}; {len(differ)} of "
        f"{_span(n, total - 1)} (first: item {differ[0] + 1}) differ in bytes and have no thumbnail "
        f"(a reference keeps {n}): not graded",
    )


def _item_count(thumb: Mapping[str, Any]) -> int:
    """How many items (the batch, or batch x frames of a video latent) the thumbnailed output had."""
    shape = list(thumb.get("shape") or ())
    if len(shape) == 5:
        return shape[0] * shape[2]
    return shape[0] if shape else 0


def _digests(thumb: Mapping[str, Any]) -> dict[int, str]:
    """0-based item index -> SHA-256, for the items of ``thumb`` past its thumbnails (none in an old reference)."""
    start = int((thumb.get("thumb_shape") or [0])[0])
    return {start + i: d for i, d in enumerate(thumb.get("item_digests") or ())}


def _grade_arrays(a: torch.Tensor, b: torch.Tensor, kind: str, threshold_db: float, env: tuple[str, ...]) -> Verdict:
    """Each item (dim 0) graded on its own; the verdict is the worst item's (PSNR, max |delta|)."""
    worst: tuple[float, float, int] | None = None
    for i in range(a.shape[0]):
        d = (a[i] - b[i]).abs()
        mse = float((d * d).mean())
        peak = 1.0 if kind == "image" else max(float(a[i].abs().max()), 1e-12)
        psnr = math.inf if mse == 0 else 10.0 * math.log10(peak * peak / mse)
        if worst is None or psnr < worst[0]:
            worst = (psnr, float(d.max()), i)
    psnr, max_abs, item = worst if worst is not None else (math.inf, 0.0, 0)
    level = "same_picture" if psnr >= threshold_db else "different_picture"
    why = f"worst: item {item + 1} of {a.shape[0]}" if a.shape[0] > 1 else ""
    return Verdict(level, psnr, max_abs, threshold_db, env, why)


def grade_tensors(
    a: torch.Tensor,
    b: torch.Tensor,
    kind: str = "image",
    *,
    identical: bool | None = None,
    record_a: Any = None,
    record_b: Any = None,
    threshold_db: float = SAME_PICTURE_PSNR_DB,
) -> Verdict:
    """Grade two full outputs (Compare): identical when their bytes are, else every item by its thumbnail.

    Args:
        a / b: IMAGEs or LATENT samples (a = reference); another shape is a different picture.
        kind: "image" or "latent".
        identical: the caller's bit-equality result (computed here when None).
        record_a / record_b: run records whose differing fields are listed.
        threshold_db: see :func:`grade`.

    Returns:
        :class:`Verdict`.

    Raises:
        ValueError: a bad ``kind`` or rank.
    """
    if identical is None:
        from .compare import bits_differ

        identical = a.shape == b.shape and a.dtype == b.dtype and not bool(bits_differ(a, b).any())
    if identical:
        return Verdict("identical", math.inf, 0.0, threshold_db)
    env = _env_diffs(record_a, record_b)
    if tuple(a.shape) != tuple(b.shape):
        return Verdict(
            "different_picture", None, None, threshold_db, env, f"shape differs: {list(a.shape)} -> {list(b.shape)}"
        )
    ta, tb = thumbnail(a, kind, max_items=None), thumbnail(b, kind, max_items=None)  # both in memory: every item
    return _grade_arrays(decode_thumbnail(ta), decode_thumbnail(tb), kind, threshold_db, env)
