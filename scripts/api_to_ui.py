"""Turn an API-format workflow into a UI-format (LiteGraph) workflow using a server's /object_info.

ComfyUI's server never converts UI to API (the frontend does), so the templates in
``example_workflows/`` are generated from their API twins with this script, which knows each node's
widget order from ``/object_info``::

    python scripts/api_to_ui.py http://127.0.0.1:8188 example_workflows/api/X.json example_workflows/X.json
    python scripts/api_to_ui.py --all     # start a server, regenerate every template from its API twin
"""
from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}


def _is_widget(spec) -> bool:
    t = spec[0]
    return isinstance(t, list) or t in WIDGET_TYPES


def convert(api: dict, object_info: dict) -> dict:
    """Convert ``api`` ({id: {class_type, inputs, _meta}}) into a LiteGraph workflow dict."""
    ids = sorted(api, key=int)
    links: list[list] = []
    nodes: list[dict] = []
    out_links: dict[tuple[str, int], list[int]] = {}
    # topological-ish order: by id is fine for layout; columns by dependency depth
    depth: dict[str, int] = {}

    def d(nid: str) -> int:
        if nid not in depth:
            srcs = [v[0] for v in api[nid]["inputs"].values() if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)]
            depth[nid] = 1 + max((d(s) for s in srcs), default=-1)
        return depth[nid]

    rows: dict[int, int] = {}
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
            if isinstance(val, list) and len(val) == 2 and isinstance(val[0], str):
                link_id = len(links) + 1
                src, slot = val
                ltype = object_info[api[src]["class_type"]]["output"][slot]
                links.append([link_id, int(src), slot, int(nid), len(inputs), ltype])
                out_links.setdefault((src, slot), []).append(link_id)
                inputs.append({"name": name, "type": spec[0] if isinstance(spec[0], str) else "COMBO", "link": link_id})
            elif _is_widget(spec):
                default = spec[1].get("default") if len(spec) > 1 and isinstance(spec[1], dict) else None
                if default is None and isinstance(spec[0], list) and spec[0]:
                    default = spec[0][0]
                widgets.append(val if val is not None else default)
                if len(spec) > 1 and isinstance(spec[1], dict) and spec[1].get("control_after_generate"):
                    widgets.append("fixed")
        col = d(nid)
        row = rows.get(col, 0)
        rows[col] = row + 1
        nodes.append({
            "id": int(nid), "type": node["class_type"], "pos": [40 + 360 * col, 40 + 260 * row], "size": [320, 200],
            "flags": {}, "order": order, "mode": 0, "inputs": inputs, "outputs": [],
            "properties": {"Node name for S&R": node["class_type"]}, "widgets_values": widgets,
            **({"title": node["_meta"]["title"]} if node.get("_meta", {}).get("title") else {}),
        })
    for n in nodes:
        info = object_info[n["type"]]
        n["outputs"] = [{"name": name, "type": t, "links": out_links.get((str(n["id"]), i), []), "slot_index": i}
                        for i, (t, name) in enumerate(zip(info["output"], info["output_name"]))]
    return {"last_node_id": max(int(i) for i in ids), "last_link_id": len(links), "nodes": nodes, "links": links,
            "groups": [], "config": {}, "extra": {}, "version": 0.4}


def regenerate_all() -> list[Path]:
    """Start a headless server with this pack and rewrite every ``example_workflows/*.json``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from comfy_server import ComfyServer

    root = Path(__file__).resolve().parents[1] / "example_workflows"
    written = []
    with ComfyServer() as server:
        info = server.get("/object_info")
        for src in sorted((root / "api").glob("*.json")):
            dst = root / src.name
            dst.write_text(json.dumps(convert(json.loads(src.read_text()), info), indent=1) + "\n")
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
