"""Parse target sizes such as ``"512x512, 768x512"`` (Warmup's ``sizes`` input). No ComfyUI imports."""

from __future__ import annotations

import re

__all__ = ["check_sizes", "parse_sizes", "warm_targets"]

_ITEM = re.compile(r"^\s*(\d+)\s*[xX\u00d7*]\s*(\d+)\s*$")


def parse_sizes(text: str | None, *, minimum: int = 8, maximum: int = 16384) -> list[tuple[int, int]]:
    """``"WxH, WxH ..."`` -> ``[(width, height), ...]`` in pixels, duplicates dropped, order kept.

    Items are separated by commas, semicolons or whitespace; ``x``, ``X``, the multiplication sign (U+00D7) or ``*``
    separate width and height. ``None`` / empty text gives ``[]``. Raises ``ValueError`` naming the bad item
    for anything else, or for a side outside ``[minimum, maximum]``.
    """
    if not text or not text.strip():
        return []
    out: list[tuple[int, int]] = []
    for item in re.split(r"[,;\s]+(?=\d)", text.strip()):
        item = item.strip().strip(",;")
        if not item:
            continue
        m = _ITEM.match(item)
        if m is None:
            raise ValueError(f"size {item!r} is not WIDTHxHEIGHT (e.g. '512x512, 768x512')")
        w, h = int(m.group(1)), int(m.group(2))
        for side in (w, h):
            if not minimum <= side <= maximum:
                raise ValueError(f"size {item!r}: {side} is outside [{minimum}, {maximum}] pixels")
        if (w, h) not in out:
            out.append((w, h))
    return out


def check_sizes(text: str | None) -> bool | str:
    """A ``validate_inputs`` result for a ``sizes`` input: ``True``, or :func:`parse_sizes`' error followed by the
    whole value (the frontend shows it under the input's name)."""
    try:
        parse_sizes(text)
    except ValueError as e:
        return f"{e}; the whole value: {text!r}"
    return True


def warm_targets(width: int, height: int, sizes: str | None) -> list[tuple[int, int]]:
    """The sizes a Warmup node warms, in order: its ``width`` x ``height`` first, then each size of ``sizes``
    (:func:`parse_sizes`) not already listed; pixels, ``(width, height)``. Both Warmup nodes (MODEL and pipeline)
    take their targets from here. Raises ``ValueError`` as :func:`parse_sizes` does."""
    return list(dict.fromkeys([(width, height), *parse_sizes(sizes)]))
