"""Text table and labelled PNG grid for :mod:`.verify` reports (Pillow for the PNG)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ..core.record.compare import diff_heatmap
from ..core.record.hashing import image_to_uint8

__all__ = ["format_table", "write_grid", "parity_label"]

_COLS_PER_ROW = 6
_LABEL_H = 54


def parity_label(entry: dict[str, Any]) -> str:
    """Short measured-parity text: "reference", "bit-equal", "max|d| 2.9e-06, 1.2% px" or "ERROR"."""
    if entry.get("error"):
        return "ERROR"
    if entry["name"] == "baseline":
        return "reference"
    p = entry.get("parity")
    if not p:
        return "-"
    if p["identical"]:
        return "bit-equal"
    return f"max|d| {float(p['max_abs']):.2g}, {p['pct_pixels_differ']:.3g}% px"


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def format_table(report: dict[str, Any]) -> str:
    """The verify report as a fixed-width table, one row per configuration, plus a verdict line.

    Columns: configuration, expected parity, measured parity vs baseline (float32 bytes), whether the
    saved 8-bit PNGs are identical, self-consistency over the runs, warm-up seconds (includes
    compilation), benchmark median seconds and time relative to the baseline (< 1 is faster).
    """
    rows = [
        ("config", "expected", "measured vs baseline", "PNG", "status", "runs", "warm-up s", "median s", "time/base")
    ]
    runs = report["settings"]["runs"]
    for e in report["configs"]:
        if e.get("error"):
            rows.append((e["name"], e["expectation"], "-", "-", "ERROR (below)", "-", "-", "-", "-"))
            continue
        p = e.get("parity")
        png = "-" if not p else ("same" if p.get("saved_identical") else "differs")
        n_same = f"{runs}/{runs} same" if e.get("self_consistent") else "MISMATCH"
        t = e.get("timing") or {}
        rows.append(
            (
                e["name"],
                e["expectation"],
                parity_label(e),
                png,
                e.get("status", ""),
                n_same,
                _fmt((e.get("warmup") or {}).get("seconds"), ".3f"),
                _fmt(t.get("median_s"), ".4f"),
                _fmt(t.get("ratio_vs_baseline"), ".2f"),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    s = report["settings"]
    src = report["source"]
    head = (
        f"steadfast verify: {src.get('pipeline', '?')} ({src.get('tiny') or src.get('path')}), "
        f"{s['dtype']} on {s['device']}, {s['width'] or 'default'}x{s['height'] or 'default'}, "
        f"{s['steps']} steps, seed {s['seed']}, batch {s['batch']}, {runs} runs, {s['rounds']} bench rounds"
    )
    verdict = (
        "SELF-CONSISTENT: every configuration gave identical digests over its runs"
        if report["ok"]
        else "NOT SELF-CONSISTENT (or the baseline failed): see the runs column"
    )
    errors = [f"  {e['name']}: {e['error']}" for e in report["configs"] if e.get("error")]
    if errors:
        errors.insert(0, "configurations that could not run:")
    return "\n".join([head, *lines, *errors, verdict])


def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def _to_pil(img: torch.Tensor, tile: int) -> Any:
    from PIL import Image

    arr = image_to_uint8(img[:1])[0]
    pil = Image.fromarray(arr if arr.shape[-1] == 3 else arr[..., :3])
    scale = max(1, math.ceil(tile / max(pil.size)))
    return pil.resize((pil.width * scale, pil.height * scale), Image.NEAREST)


def write_grid(entries: list[dict[str, Any]], images: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write a PNG: per configuration the first image, and under it a heat map of where it differs from
    the baseline (normalised to its own largest difference; black when bit-equal), each column labelled
    with the configuration, the measured parity and the expectation. Returns ``path``.

    Raises:
        ValueError: no images, or no baseline image.
    """
    from PIL import Image, ImageDraw

    if "baseline" not in images:
        raise ValueError("the grid needs the baseline image")
    names = [e["name"] for e in entries if e["name"] in images]
    by_name = {e["name"]: e for e in entries}
    base = images["baseline"]
    tile = max(160, max(base.shape[1], base.shape[2]))
    first = _to_pil(base, tile)
    tw, th = first.size
    ncols = min(_COLS_PER_ROW, len(names))
    nrows = math.ceil(len(names) / ncols)
    cell_h = _LABEL_H + 2 * th + 6
    canvas = Image.new("RGB", (ncols * (tw + 6) + 6, nrows * cell_h + 6), (32, 32, 32))
    draw = ImageDraw.Draw(canvas)
    font, small = _font(13), _font(11)
    for i, name in enumerate(names):
        x = 6 + (i % ncols) * (tw + 6)
        y = 6 + (i // ncols) * cell_h
        e = by_name[name]
        label = parity_label(e)
        colour = (120, 220, 120) if label in ("bit-equal", "reference") else (240, 190, 90)
        draw.text((x, y), name[: max(8, tw // 8)], fill=(255, 255, 255), font=font)
        draw.text((x, y + 17), label, fill=colour, font=small)
        draw.text((x, y + 33), f"expected: {e['expectation']}", fill=(180, 180, 180), font=small)
        canvas.paste(_to_pil(images[name], tile), (x, y + _LABEL_H))
        heat = diff_heatmap(base[:1], images[name][:1], kind="image", normalize=True)
        hy = y + _LABEL_H + th + 2
        canvas.paste(_to_pil(heat, tile), (x, hy))
        same = bool(e.get("parity") and e["parity"]["identical"]) or name == "baseline"
        draw.text((x + 3, hy + 2), "no difference" if same else "|diff| / its max", fill=(200, 200, 200), font=small)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out, format="PNG")
    return out
