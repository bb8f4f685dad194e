"""Screenshots of the four templates after a run, in the real ComfyUI frontend (``docs/templates/*.png``).

Each template is loaded into the page, run with the Run button's call (``app.queuePrompt``) on the embedded tiny
SD1.5 checkpoint (the Diffusers template on the tiny SD pipeline, ``steadfast tiny-pipeline``, chosen in its
pipeline_name widget, at 128x128 and 4 steps: its inductor compile at 512x512 takes too long on a 2-core CPU;
everything else as shipped), and the whole page is captured once the reports are shown.
Small palette PNGs (1200 px wide), named ``<api name>-comfyui-<version>.png``::

    COMFYUI_PATH=~/comfy/ComfyUI-0.8.0 ~/comfy/venv-0.8.0/bin/python scripts/screenshot_templates.py [API_NAME ...]

Needs Debian's ``chromium`` and the ``playwright`` package (no browser download).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "headless"), str(ROOT / "scripts")]
from comfy_server import ComfyServer, find_comfyui  # noqa: E402
import api_to_ui  # noqa: E402
import tiny_sd15  # noqa: E402

CHROMIUM = os.environ.get("STEADFAST_CHROMIUM", "/usr/bin/chromium")
OUT = ROOT / "docs" / "templates"
TINY_PIPELINE = "steadfast-tiny-sd"


def _version(comfyui: Path) -> str:
    text = (comfyui / "comfyui_version.py").read_text(encoding="utf-8")
    return text.split('"')[1] if '"' in text else "unknown"


def _run_from_page(page, server: ComfyServer, timeout: float = 900) -> dict:
    client_id = page.evaluate("() => window.app.api.clientId")
    known = set(server.get("/history"))
    page.evaluate("async () => { await window.app.queuePrompt(0, 1) }")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hist = server.get("/history")
        ours = [p for p, e in hist.items() if p not in known and e["prompt"][3].get("client_id") == client_id]
        if ours and hist[ours[0]].get("status", {}).get("completed") is not None:
            return hist[ours[0]]
        time.sleep(0.5)
    raise TimeoutError("the template did not finish")


def main() -> int:
    from PIL import Image
    from playwright.sync_api import sync_playwright

    from _steadfast_import import import_steadfast
    import_steadfast()
    from steadfast.core import tiny

    comfyui = find_comfyui()
    if comfyui is None:
        print("set COMFYUI_PATH", file=sys.stderr)
        return 2
    version = _version(comfyui)
    OUT.mkdir(parents=True, exist_ok=True)
    ckpt = tiny_sd15.cached_tiny_sd15(tiny_sd15.default_cache_dir(), in_subprocess=True)
    with tempfile.TemporaryDirectory() as tmp, \
            ComfyServer({tiny_sd15.CHECKPOINT_NAME: ckpt}, comfyui=comfyui) as server, sync_playwright() as pw:
        server.link_models("diffusers", {TINY_PIPELINE: tiny.build_tiny_sd(Path(tmp) / "sd")})
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        # a large page: FitView then stays above the zoom at which the frontend stops drawing text
        page = browser.new_page(viewport={"width": 2400, "height": 1400})
        page.goto(server.url + "/", wait_until="domcontentloaded")
        page.wait_for_function("() => !!(window.app && window.app.graph && window.app.canvas)", timeout=60_000)
        page.keyboard.press("Escape")
        for setting in ("Comfy.Minimap.Visible", "Comfy.Graph.CanvasInfo"):
            page.evaluate("async (k) => { try { await window.app.extensionManager.setting.set(k, false) }"
                          " catch (e) {} }", setting)
        only = set(sys.argv[1:])
        for api_name, title in api_to_ui.TEMPLATE_TITLES.items():
            if only and api_name not in only:
                continue
            wf = json.loads((ROOT / "example_workflows" / f"{title}.json").read_text(encoding="utf-8"))
            page.evaluate("async (wf) => { await window.app.loadGraphData(wf) }", wf)
            page.evaluate("(name) => { for (const n of window.app.graph.nodes) for (const w of n.widgets ?? [])"
                          " if (w.name === 'pipeline_name') w.value = name }", TINY_PIPELINE)
            if api_name == "pipeline_generate":
                page.evaluate("() => { for (const n of window.app.graph.nodes) for (const w of n.widgets ?? []) {"
                              " if (w.name === 'width' || w.name === 'height') w.value = 128;"
                              " if (w.name === 'steps' && n.type === 'SteadfastPipelineSampler') w.value = 4 } }")
            entry = _run_from_page(page, server)
            status = entry["status"]["status_str"]
            # dialogs and any full-page dimming layer (the template browser's, in either frontend)
            page.evaluate("() => { document.querySelectorAll('[role=dialog], .p-dialog-mask').forEach(d => d.remove());"
                          " document.querySelectorAll('body *').forEach(e => { const s = getComputedStyle(e);"
                          " if (s.position === 'fixed' && e.offsetWidth >= innerWidth && e.offsetHeight >= innerHeight"
                          " && !e.querySelector('canvas') && s.backgroundColor !== 'rgba(0, 0, 0, 0)') e.remove() }) }")
            page.evaluate("() => window.app.extensionManager.command.execute('Comfy.Canvas.FitView')")
            page.wait_for_timeout(1500)
            shot = Path(tmp) / "shot.png"
            page.screenshot(path=str(shot))
            img = Image.open(shot).convert("RGB")
            img = img.crop((60, 40, img.width, img.height))  # the side bar and tab row
            img.thumbnail((1200, 1200))
            out = OUT / f"{api_name}-comfyui-{version}.png"
            img.quantize(colors=128).save(out, optimize=True)
            print(out.relative_to(ROOT), status, img.size, out.stat().st_size, "bytes")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
