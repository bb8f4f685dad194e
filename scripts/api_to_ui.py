"""Turn an API-format workflow into a UI-format (LiteGraph) workflow using a server's /object_info.

ComfyUI's server never converts UI to API (the frontend does), so the templates in
``example_workflows/`` are generated from their API twins with this script, which knows each node's
widget order from ``/object_info``. Optional widgets the API twin leaves out get their ``/object_info``
defaults (the frontend always sends every widget); a widget fed by a link keeps its slot in ``widgets_values``.
Nodes are laid out in columns by dependency depth, sized like the frontend sizes them, with room for what
appears after a run (our info box, image previews), so nothing overlaps::

    python scripts/api_to_ui.py http://127.0.0.1:8188 example_workflows/api/X.json example_workflows/X.json
    python scripts/api_to_ui.py --all     # start a server, regenerate every template from its API twin
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}

# The template browser shows a custom node template's file name as its title (and, with - and _ as spaces, as its
# description), so the UI templates carry readable names; their API twins keep short ones (tests, scripts, API use).
TEMPLATE_TITLES = {
    "determinism_check": "Determinism check",
    "optimized_vs_baseline": "Optimized vs baseline",
    "warmup_then_generate": "Warmup then generate",
    "pipeline_generate": "Diffusers pipeline",
}


# What each template needs before Run, shown in a Note node at its top left (the frontend's own "Note": not part of
# the prompt). Three templates name the tiny checkpoint that only the pack's headless check builds.
_TINY_NOTE = (
    "BEFORE YOU RUN: pick a checkpoint in Load Checkpoint.\n"
    "This template names steadfast_tiny_sd15.safetensors, a tiny random-weight SD1.5-architecture model that the "
    "pack's headless check (steadfast run) builds for itself; its pictures are noise, and it is not in your models "
    "folder. Any SD1.5 checkpoint you have will do (e.g. v1-5-pruned-emaonly-fp16.safetensors, which ComfyUI's own "
    "SD1.5 template offers to download): the check compares this run with another run or a pinned hash, never with "
    "a fixed picture."
)
TEMPLATE_NOTES = {
    "determinism_check": _TINY_NOTE,
    "optimized_vs_baseline": _TINY_NOTE,
    "warmup_then_generate": _TINY_NOTE + "\nWarmup compiles the model (inductor): minutes on a CPU, once.",
    "pipeline_generate": (
        "BEFORE YOU RUN: Load Diffusers Pipeline needs a diffusers pipeline folder (model_index.json and its "
        "subfolders) in ComfyUI/models/diffusers; pipeline_name lists what is there.\n"
        "To try the template now, one command in the ComfyUI folder writes a tiny random-weight pipeline (its "
        "pictures are noise):\n"
        "  python custom_nodes/ComfyUI-Steadfast/scripts/steadfast.py tiny-pipeline "
        "models/diffusers/steadfast-tiny-sd\n"
        "then press R in ComfyUI to refresh the lists and pick steadfast-tiny-sd. A real model: download a "
        "diffusers-format repository folder (e.g. stable-diffusion-v1-5, all its subfolders: huggingface-cli "
        "download) into models/diffusers.\n"
        "These defaults (256x256, 4 steps, no compile) are for a first try: on a 2-core CPU they finish in under a "
        "minute with a small pipeline. For real use raise width/height (Warmup and Sampler alike) to 512, steps to "
        "20-30, and set Pipeline Optimize compile=regional (inductor), best on a GPU."
    ),
}
NOTE_WIDTH, NOTE_HEIGHT = 320, 300


def ui_template_name(api_name: str) -> str:
    """The file stem of the UI template made from ``example_workflows/api/<api_name>.json``."""
    return TEMPLATE_TITLES.get(api_name, api_name)


def api_template_name(ui_name: str) -> str:
    """The API twin's stem for a UI template stem (inverse of :func:`ui_template_name`)."""
    return next((k for k, v in TEMPLATE_TITLES.items() if v == ui_name), ui_name)


# Layout, in canvas pixels, matching ComfyUI frontend 1.35's LGraphNode.computeSize() (measured): a slot row is
# 20, a widget 24 (a multi-line text box 54), plus 6 / 8 margins; the title bar (30) sits above ``pos``.
NODE_WIDTH, COLUMN_STEP, ROW_GAP, TITLE_HEIGHT = 320, 360, 40, 30
# Room for what appears after a run: the info box js/steadfast.js adds to our nodes, image previews.
INFO_BOX_HEIGHT, PREVIEW_HEIGHT = 90, 220


def is_widget(spec) -> bool:
    """True when the frontend draws a widget for input ``spec`` (a ``forceInput`` STRING/INT/... is a socket only)."""
    t = spec[0]
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    return (isinstance(t, list) or t in WIDGET_TYPES) and not opts.get("forceInput")


def widget_default(spec):
    """The value the frontend gives a fresh widget for input ``spec`` (``/object_info`` form): its ``default``,
    else the first option of a combo (V1 ``[[options], {...}]`` or V3 ``["COMBO", {"options": [...]}]``), else None."""
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if opts.get("default") is not None:
        return opts["default"]
    choices = spec[0] if isinstance(spec[0], list) else opts.get("options")
    return choices[0] if choices else None


def node_height(info: dict, n_widgets: int, n_multiline: int) -> int:
    """Height (without title) the frontend gives a fresh node of class ``info`` (``/object_info`` entry) with
    ``n_widgets`` widgets, ``n_multiline`` of them multi-line text boxes."""
    specs = {**info["input"].get("required", {}), **info["input"].get("optional", {})}
    slot_rows = max(sum(1 for spec in specs.values() if not is_widget(spec)), len(info["output"]))
    height = 20 * slot_rows + 6
    if n_widgets:
        height += 24 * (n_widgets - n_multiline) + 54 * n_multiline + 8
    return height


def after_run_room(class_type: str, info: dict) -> int:
    """Extra height a node may grow by after a run (our info box; an output node's image previews)."""
    if class_type.startswith("Steadfast"):
        return INFO_BOX_HEIGHT
    return PREVIEW_HEIGHT if info.get("output_node") and not info["output"] else 0


def convert(api: dict, object_info: dict, note: str | None = None) -> dict:
    """Convert ``api`` ({id: {class_type, inputs, _meta}}) into a LiteGraph workflow dict; ``note``: the text of a
    Note node put at the top of the first column (the frontend's virtual node: not part of the prompt)."""
    ids = sorted(api, key=int)
    links: list[list] = []
    nodes: list[dict] = []
    out_links: dict[tuple[str, int], list[int]] = {}
    # topological-ish order: by id is fine for layout; columns by dependency depth
    depth: dict[str, int] = {}

    def d(nid: str) -> int:
        if nid not in depth:
            srcs = [
                v[0]
                for v in api[nid]["inputs"].values()
                if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
            ]
            depth[nid] = 1 + max((d(s) for s in srcs), default=-1)
        return depth[nid]

    column_y: dict[int, int] = {0: 40 + TITLE_HEIGHT + NOTE_HEIGHT + TITLE_HEIGHT + ROW_GAP} if note else {}
    for order, nid in enumerate(ids):
        node = api[nid]
        info = object_info[node["class_type"]]
        req = info["input"].get("required", {})
        opt = info["input"].get("optional", {})
        order_names = info.get("input_order", {})
        names = list(order_names.get("required", req)) + list(order_names.get("optional", opt))
        specs = {**req, **opt}
        inputs, widgets = [], []
        for name in names:
            spec = specs[name]
            val = node["inputs"].get(name)
            linked = isinstance(val, list) and len(val) == 2 and isinstance(val[0], str)
            if linked:
                link_id = len(links) + 1
                src, slot = val
                ltype = object_info[api[src]["class_type"]]["output"][slot]
                links.append([link_id, int(src), slot, int(nid), len(inputs), ltype])
                out_links.setdefault((src, slot), []).append(link_id)
                slot_info = {"name": name, "type": spec[0] if isinstance(spec[0], str) else "COMBO", "link": link_id}
                if is_widget(spec):  # a widget driven by a link keeps its widget (and its place in widgets_values)
                    slot_info["widget"] = {"name": name}
                inputs.append(slot_info)
            if is_widget(spec):
                widgets.append(widget_default(spec) if linked or val is None else val)
                if len(spec) > 1 and isinstance(spec[1], dict) and spec[1].get("control_after_generate"):
                    widgets.append("fixed")
        col = d(nid)
        n_multiline = sum(
            1
            for name in names
            if is_widget(specs[name])
            and len(specs[name]) > 1
            and isinstance(specs[name][1], dict)
            and specs[name][1].get("multiline")
        )
        height = node_height(info, len(widgets), n_multiline)
        y = column_y.get(col, 40 + TITLE_HEIGHT)
        column_y[col] = y + height + after_run_room(node["class_type"], info) + TITLE_HEIGHT + ROW_GAP
        nodes.append(
            {
                "id": int(nid),
                "type": node["class_type"],
                "pos": [40 + COLUMN_STEP * col, y],
                "size": [NODE_WIDTH, height],
                "flags": {},
                "order": order,
                "mode": 0,
                "inputs": inputs,
                "outputs": [],
                "properties": {"Node name for S&R": node["class_type"]},
                "widgets_values": widgets,
                **({"title": node["_meta"]["title"]} if node.get("_meta", {}).get("title") else {}),
            }
        )
    for n in nodes:
        info = object_info[n["type"]]
        n["outputs"] = [
            {"name": name, "type": t, "links": out_links.get((str(n["id"]), i), []), "slot_index": i}
            for i, (t, name) in enumerate(zip(info["output"], info["output_name"]))
        ]
    if note:
        nodes.append(
            {
                "id": max(int(i) for i in ids) + 1,
                "type": "Note",
                "pos": [40, 40 + TITLE_HEIGHT],
                "size": [NOTE_WIDTH, NOTE_HEIGHT],
                "flags": {},
                "order": len(nodes),
                "mode": 0,
                "inputs": [],
                "outputs": [],
                "title": "Before you run",
                "properties": {"text": ""},
                "widgets_values": [note],
                "color": "#432",
                "bgcolor": "#653",
            }
        )
    return {
        "last_node_id": max(n["id"] for n in nodes),
        "last_link_id": len(links),
        "nodes": nodes,
        "links": links,
        "groups": [],
        "config": {},
        "extra": {},
        "version": 0.4,
    }


def regenerate_all() -> list[Path]:
    """Start a headless server with this pack and rewrite every ``example_workflows/*.json``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "headless"))
    from comfy_server import ComfyServer

    root = Path(__file__).resolve().parents[1] / "example_workflows"
    written = []
    with ComfyServer() as server:
        info = server.get("/object_info")
        for src in sorted((root / "api").glob("*.json")):
            dst = root / f"{ui_template_name(src.stem)}.json"
            note = TEMPLATE_NOTES.get(src.stem)
            dst.write_text(json.dumps(convert(json.loads(src.read_text()), info, note), indent=1) + "\n")
            written.append(dst)
    return written


def main(argv: list[str]) -> int:
    if argv == ["--all"]:
        for p in regenerate_all():
            print(p)
        return 0
    url, src, dst = argv
    info = json.load(urllib.request.urlopen(url.rstrip("/") + "/object_info"))
    with open(src) as f:
        api = json.load(f)
    with open(dst, "w") as f:
        json.dump(convert(api, info), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
