"""Screenshots of the four templates after a run, in the real ComfyUI frontend (``docs/templates/*.png``), in both
renderers (the classic canvas and, where the frontend has it, "Nodes 2.0"), and the template browser's thumbnails
(``example_workflows/<title>.jpg``: the run's output picture with the graph beside it).

Each template is loaded into the page and run with the Run button's call (``app.queuePrompt``) as shipped, on the
embedded tiny SD1.5 checkpoint (the Diffusers template on the tiny SD pipeline, ``steadfast tiny-pipeline``, chosen
in its pipeline_name widget); the page is captured once the reports are shown, and each run's wall time printed.
Each capture is checked as a user would look at it: no two nodes overlap (in Nodes 2.0 by the node elements on the
page) and every node whose run output has a report shows it; the script prints both per picture and exits 1 when a
picture fails either (the picture is still written, to look at).
Small palette PNGs (1200 px wide), named ``<api name>-comfyui-<version>.png`` (canvas) and
``<api name>-comfyui-<version>-nodes2.png`` (``-comfyui-<version>-frontend-<frontend>`` with a frontend other than
the one that ComfyUI pins: put first on ``PYTHONPATH`` as ``scripts/test_newer_frontend.sh`` does)::

    COMFYUI_PATH=~/comfy/ComfyUI-0.8.0 ~/comfy/venv-0.8.0/bin/python scripts/screenshot_templates.py \
        [--thumbnails] [--nodes2-only] [API_NAME ...]

Tiny random-weight models, so the pictures are noise. Needs Debian's ``chromium`` and the ``playwright`` package
(no browser download).
"""

from __future__ import annotations

import base64
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "headless"), str(ROOT / "scripts")]
import api_to_ui  # noqa: E402
import tiny_sd15  # noqa: E402
from comfy_server import ComfyServer, find_comfyui  # noqa: E402

CHROMIUM = os.environ.get("STEADFAST_CHROMIUM", "/usr/bin/chromium")
OUT = ROOT / "docs" / "templates"
TINY_PIPELINE = "steadfast-tiny-sd"


def _version(comfyui: Path) -> str:
    text = (comfyui / "comfyui_version.py").read_text(encoding="utf-8")
    return text.split('"')[1] if '"' in text else "unknown"


def _frontend_label(comfyui: Path) -> str:
    """``-frontend-<version>`` when the frontend the server will serve (``comfyui-frontend-package``, as this
    process imports it: ``scripts/test_newer_frontend.sh``'s ``PYTHONPATH`` way) is not the one ComfyUI pins in its
    requirements.txt; "" when it is."""
    import importlib.metadata as md

    served = md.version("comfyui-frontend-package")
    pins = [
        line.split("==", 1)[1].strip()
        for line in (comfyui / "requirements.txt").read_text().splitlines()
        if line.startswith("comfyui-frontend-package==")
    ]
    return "" if served in pins else f"-frontend-{served}"


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


# What a screenshot must show, checked on the page it is taken from (the same rules as tests/comfy/test_frontend.py):
# node pairs that overlap (the canvas: the graph's pos/size with the title bar; Nodes 2.0: the node elements'
# rectangles on the page, by more than 1 px), and the nodes whose run output has a report but whose report box is
# empty or, in Nodes 2.0, not in the page.
CHECK_JS = """([renderer, reported]) => {
  const th = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
  const boxes = renderer === 'nodes2'
    ? [...document.querySelectorAll('.lg-node[data-node-id]')].map(e => { const r = e.getBoundingClientRect();
        return [e.dataset.nodeId, r.left, r.top, r.right, r.bottom] })
    : window.app.graph.nodes.map(n => [String(n.id), n.pos[0], n.pos[1] - th, n.pos[0] + n.size[0],
        n.pos[1] + n.size[1]]);
  const overlaps = [];
  for (const a of boxes) for (const b of boxes)
    if (+a[0] < +b[0] && a[1] < b[3] - 1 && b[1] < a[3] - 1 && a[2] < b[4] - 1 && b[2] < a[4] - 1)
      overlaps.push([a[0], b[0]]);
  const unshown = reported.filter(id => { const w = window.app.graph.getNodeById(+id)?.widgets
    ?.find(x => x.name === 'steadfast_info');
    return !w?.value || (renderer === 'nodes2' && !w.element?.isConnected) });
  return {overlaps, unshown};
}"""

THUMB_SIZE, THUMB_BG = (768, 512), (30, 30, 30)


def write_thumbnail(page, server: ComfyServer, entry: dict, out: Path) -> str:
    """The template browser's card image: the run's first saved picture (nearest-neighbour enlarged: the tiny models
    make 64-px noise) on the left, the graph as the canvas draws it (its own pixels, no menus) on the right."""
    from PIL import Image

    card = Image.new("RGB", THUMB_SIZE, THUMB_BG)
    saved = next((o["images"][0] for o in entry["outputs"].values() if o.get("images")), None)
    side = THUMB_SIZE[1] - 32
    if saved is not None:
        pic = Image.open(io.BytesIO(server.view(saved))).convert("RGB")
        card.paste(pic.resize((side, side), Image.NEAREST), (16, 16))
    data = page.evaluate(
        "() => { const c = window.app.canvas; c.draw(true, true); return c.canvas.toDataURL('image/png') }"
    )
    graph = Image.open(io.BytesIO(base64.b64decode(data.split(",", 1)[1]))).convert("RGB")
    bg = Image.new("RGB", graph.size, graph.getpixel((0, 0)))
    from PIL import ImageChops

    box = ImageChops.difference(graph, bg).convert("L").point(lambda v: 255 if v > 16 else 0).getbbox()
    graph = graph.crop(box) if box else graph
    # beside the picture; a template that saves no picture (Optimized vs baseline compares two) gets the whole card
    if saved is not None:
        left, room = side + 32, (THUMB_SIZE[0] - side - 48, side)
    else:
        left, room = 16, (THUMB_SIZE[0] - 32, side)
    graph.thumbnail(room)
    card.paste(graph, (left + (room[0] - graph.width) // 2, 16 + (room[1] - graph.height) // 2))
    for quality in (85, 75, 65, 55, 45):  # the template browser loads every card: keep each under 60 KB
        card.save(out, "JPEG", quality=quality, optimize=True)
        if out.stat().st_size < 55_000:
            break
    return f"{out.relative_to(ROOT)} {card.size} {out.stat().st_size} bytes"


def main() -> int:
    from _steadfast_import import import_steadfast
    from PIL import Image
    from playwright.sync_api import sync_playwright

    import_steadfast()
    from steadfast.headless import tiny_pipelines as tiny

    comfyui = find_comfyui()
    if comfyui is None:
        print("set COMFYUI_PATH", file=sys.stderr)
        return 2
    version = _version(comfyui) + _frontend_label(comfyui)
    OUT.mkdir(parents=True, exist_ok=True)
    ckpt = tiny_sd15.cached_tiny_sd15(tiny_sd15.default_cache_dir(), in_subprocess=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        ComfyServer({tiny_sd15.CHECKPOINT_NAME: ckpt}, comfyui=comfyui) as server,
        sync_playwright() as pw,
    ):
        server.link_models("diffusers", {TINY_PIPELINE: tiny.build_tiny_sd(Path(tmp) / "sd")})
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        # a large page: FitView then stays above the zoom at which the frontend stops drawing text
        page = browser.new_page(viewport={"width": 2400, "height": 1400})
        page.goto(server.url + "/", wait_until="domcontentloaded")
        page.wait_for_function("() => !!(window.app && window.app.graph && window.app.canvas)", timeout=60_000)
        page.keyboard.press("Escape")
        for setting in ("Comfy.Minimap.Visible", "Comfy.Graph.CanvasInfo"):
            page.evaluate(
                "async (k) => { try { await window.app.extensionManager.setting.set(k, false) } catch (e) {} }",
                setting,
            )
        args = sys.argv[1:]
        thumbs = "--thumbnails" in args
        only = {a for a in args if not a.startswith("--")}
        has_vue = page.evaluate(
            "() => { try { window.app.extensionManager.setting.get('Comfy.VueNodes.Enabled');"
            " return true } catch (e) { return false } }"
        )
        renderers = ("canvas", "nodes2") if has_vue else ("canvas",)
        problems: list[str] = []
        if "--nodes2-only" in args:
            renderers = tuple(r for r in renderers if r == "nodes2")
        for renderer in renderers:
            page.evaluate(
                "async (on) => { try { await window.app.extensionManager.setting.set("
                "'Comfy.VueNodes.Enabled', on) } catch (e) {} }",
                renderer == "nodes2",
            )
            for api_name, title in api_to_ui.TEMPLATE_TITLES.items():
                if only and api_name not in only:
                    continue
                wf = json.loads((ROOT / "example_workflows" / f"{title}.json").read_text(encoding="utf-8"))
                page.evaluate("async (wf) => { await window.app.loadGraphData(wf) }", wf)
                page.evaluate(
                    "(name) => { for (const n of window.app.graph.nodes) for (const w of n.widgets ?? [])"
                    " if (w.name === 'pipeline_name') w.value = name }",
                    TINY_PIPELINE,
                )
                server.free()  # every node runs: the wall time is a first run's
                start = time.monotonic()
                entry = _run_from_page(page, server)
                seconds = time.monotonic() - start
                status = entry["status"]["status_str"]
                page.wait_for_timeout(1500)  # the reports reach the page
                # dialogs and any full-page dimming layer (the template browser's, in either frontend)
                page.evaluate(
                    "() => { document.querySelectorAll('[role=dialog], .p-dialog-mask')"
                    ".forEach(d => d.remove());"
                    " document.querySelectorAll('body *').forEach(e => { const s = getComputedStyle(e);"
                    " if (s.position === 'fixed' && e.offsetWidth >= innerWidth"
                    " && e.offsetHeight >= innerHeight"
                    " && !e.querySelector('canvas') && s.backgroundColor !== 'rgba(0, 0, 0, 0)')"
                    " e.remove() }) }"
                )
                page.evaluate("() => window.app.extensionManager.command.execute('Comfy.Canvas.FitView')")
                page.wait_for_timeout(1500)
                reported = [i for i, o in entry["outputs"].items() if o.get("text")]
                seen = page.evaluate(CHECK_JS, [renderer, reported])
                if seen["overlaps"] or seen["unshown"]:
                    problems.append(
                        f"{api_name} {renderer}: overlapping nodes {seen['overlaps']}, reports not "
                        f"shown {seen['unshown']}"
                    )
                shot = Path(tmp) / "shot.png"
                page.screenshot(path=str(shot))
                img = Image.open(shot).convert("RGB")
                img = img.crop((60, 40, img.width, img.height))  # the side bar and tab row
                img.thumbnail((1200, 1200))
                suffix = "-nodes2" if renderer == "nodes2" else ""
                out = OUT / f"{api_name}-comfyui-{version}{suffix}.png"
                img.quantize(colors=128).save(out, optimize=True)
                print(
                    out.relative_to(ROOT),
                    renderer,
                    status,
                    f"run {seconds:.1f} s",
                    img.size,
                    out.stat().st_size,
                    "bytes",
                    f"reports shown {len(reported) - len(seen['unshown'])}/{len(reported)}",
                    f"overlapping node pairs {len(seen['overlaps'])}",
                )
                if thumbs and renderer == "canvas":
                    print(write_thumbnail(page, server, entry, ROOT / "example_workflows" / f"{title}.jpg"))
        browser.close()
    for line in problems:
        print("NOT AS A USER SHOULD SEE IT:", line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
