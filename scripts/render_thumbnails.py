"""Render the template thumbnails (``example_workflows/<name>.jpg``): each template as the real ComfyUI frontend
draws it (headless Chromium, Debian's ``chromium`` + the ``playwright`` package), fitted to the view; the image is
the graph canvas's own pixels (``canvas.toDataURL``), so no menus, dialogs or minimap appear in it.

    python scripts/render_thumbnails.py            # rewrites every example_workflows/*.jpg

The template browser shows ``<name>.jpg`` beside ``<name>.json`` as the card image.
"""
from __future__ import annotations

import base64
import io
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "headless"))
from comfy_server import ComfyServer  # noqa: E402

CHROMIUM = os.environ.get("STEADFAST_CHROMIUM", "/usr/bin/chromium")
SIZE = (768, 512)


def _content_box(img, margin: int = 24) -> tuple[int, int, int, int]:
    """The box around everything that is not canvas background (the top-left pixel's colour), plus a margin."""
    from PIL import ImageChops, Image
    background = Image.new("RGB", img.size, img.getpixel((0, 0)))
    box = ImageChops.difference(img, background).convert("L").point(lambda v: 255 if v > 16 else 0).getbbox()
    if box is None:
        return (0, 0, *img.size)
    left, top, right, bottom = box
    return (max(0, left - margin), max(0, top - margin), min(img.width, right + margin),
            min(img.height, bottom + margin))


def main() -> int:
    from PIL import Image
    from playwright.sync_api import sync_playwright

    folder = ROOT / "example_workflows"
    with ComfyServer() as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 2600, "height": 1400})
        page.goto(server.url + "/", wait_until="domcontentloaded")
        page.wait_for_function("() => !!(window.app && window.app.graph && window.app.canvas)", timeout=60_000)
        page.keyboard.press("Escape")  # the template dialog opens by itself on a first visit
        for setting in ("Comfy.Minimap.Visible", "Comfy.Graph.CanvasInfo"):  # no minimap, no FPS corner text
            page.evaluate("async (k) => { try { await window.app.extensionManager.setting.set(k, false) }"
                          " catch (e) {} }", setting)
        for wf in sorted(folder.glob("*.json")):
            page.evaluate("async (wf) => { await window.app.loadGraphData(wf) }", json.loads(wf.read_text()))
            page.evaluate("() => { document.querySelectorAll('[role=dialog]').forEach(d => d.remove());"
                          " window.app.canvas.ds.scale = 1; window.app.graph.setDirtyCanvas(true, true) }")
            page.evaluate("() => window.app.extensionManager.command.execute('Comfy.Canvas.FitView')")
            page.wait_for_timeout(500)
            # the graph canvas's own pixels: no side/top bars, dialogs, overlays or minimap
            data = page.evaluate("() => { const c = window.app.canvas; c.draw(true, true);"
                                 " return c.canvas.toDataURL('image/png') }")
            img = Image.open(io.BytesIO(base64.b64decode(data.split(",", 1)[1]))).convert("RGB")
            img = img.crop(_content_box(img))
            img.thumbnail(SIZE)
            out = wf.with_suffix(".jpg")
            img.save(out, "JPEG", quality=85, optimize=True)
            print(out, img.size, out.stat().st_size, "bytes")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
