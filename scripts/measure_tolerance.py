"""Measure the graded-verdict tolerance and the portable-mode cost: ``python scripts/measure_tolerance.py``.

Runs the determinism-check workflow (``example_workflows/api/determinism_check.json``, embedded tiny model) on
headless ComfyUI servers started with different CPU settings (one fresh server per setting: torch, oneDNN and
MKL read their variables at start-up), and on the default server with a bf16/fp16 precision and another seed.
Every output's thumbnail (the Hash node's reference, :mod:`core.record.verdict`) is compared with the default run's:
PSNR and max |delta|. Prints one Markdown row per variant, then the portable vs default timing (median of
``--repeat`` prompts, the sampler's own seconds and the prompt's wall time). ``docs/reproducing.md`` quotes it.
Needs ComfyUI (``COMFYUI_PATH``); takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "headless"))
sys.path.insert(0, str(ROOT))

from comfy_server import ComfyServer  # noqa: E402
from tiny_sd15 import CHECKPOINT_NAME, cached_tiny_sd15  # noqa: E402

from core.determinism.portable import portable_env  # noqa: E402
from core.record import verdict  # noqa: E402

WORKFLOW = ROOT / "example_workflows" / "api" / "determinism_check.json"

SERVERS = {
    "default": {},
    "threads=1": {"OMP_NUM_THREADS": "1"},
    "oneDNN ISA SSE41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
    "MKL_CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},
    "ATen capability default (no AVX2)": {"ATEN_CPU_CAPABILITY": "default"},
    "portable": "portable",
}


def with_optimize(wf: dict, server: ComfyServer, precision: str) -> dict:
    """``wf`` with an Optimize Model node (every widget at its default, ``precision`` set) before the samplers."""
    info = server.get("/object_info/SteadfastOptimizeModel")["SteadfastOptimizeModel"]["input"]
    inputs = {"model": ["5", 0]}
    for group in ("required", "optional"):
        for name, spec in info.get(group, {}).items():
            if name != "model" and isinstance(spec[1] if len(spec) > 1 else None, dict) and "default" in spec[1]:
                inputs[name] = spec[1]["default"]
            elif name != "model" and isinstance(spec[0], list):
                inputs[name] = spec[0][0]
    inputs["precision"] = precision
    out = copy.deepcopy(wf)
    out["90"] = {"class_type": "SteadfastOptimizeModel", "inputs": inputs}
    for n in ("6", "7"):
        out[n]["inputs"]["model"] = ["90", 0]
    return out


def run(server: ComfyServer, wf: dict) -> tuple[dict, float, float | None]:
    """(Hash node 11's ui item, the prompt's wall seconds, the sampler's seconds)."""
    server.free(unload_models=False, free_memory=True)
    t0 = time.perf_counter()
    entry = server.wait(server.queue(wf), timeout=1800)
    wall = time.perf_counter() - t0
    item = entry["outputs"]["11"]["steadfast_hash"][0]
    rec = (entry["outputs"].get("6", {}).get("steadfast_run_record") or [{}])[0]
    return item, wall, rec.get("seconds")


def cost(rounds: int) -> int:
    """Portable vs default cost: three servers alive at once (default, default with 1 thread, portable), prompts
    interleaved round by round (load drift is spread over all three); also more different-picture samples
    (other seeds, another prompt) graded against the default run. Prints Markdown."""
    wf = json.loads(WORKFLOW.read_text())
    ckpt = cached_tiny_sd15(in_subprocess=True)
    envs = {"default (2 threads)": {}, "default, 1 thread": {"OMP_NUM_THREADS": "1"}, "portable": portable_env()}
    servers = {n: ComfyServer({CHECKPOINT_NAME: ckpt}, env=e).start() for n, e in envs.items()}
    try:
        walls: dict[str, list[float]] = {n: [] for n in servers}
        secs: dict[str, list[float]] = {n: [] for n in servers}
        for _ in range(rounds):
            for n, srv in servers.items():
                _, wall, sec = run(srv, wf)
                walls[n].append(wall)
                secs[n].append(sec)
        srv = servers["default (2 threads)"]
        ref = run(srv, wf)[0]
        others = {}
        for seed in (43, 44, 1000):
            w = copy.deepcopy(wf)
            for n in ("6", "7"):
                w[n]["inputs"]["seed"] = seed
            others[f"seed {seed}"] = run(srv, w)[0]
        w = copy.deepcopy(wf)
        w["2"]["inputs"]["text"] = "a red bicycle leaning on a wall"
        others["another prompt"] = run(srv, w)[0]
    finally:
        for s in servers.values():
            s.close()
    print("| server | prompt wall s (median, min) | sampler s (median, min) |\n|---|---|---|")
    for n in servers:
        print(
            f"| {n} | {statistics.median(walls[n]):.2f}, {min(walls[n]):.2f} | "
            f"{statistics.median(secs[n]):.2f}, {min(secs[n]):.2f} |"
        )
    print("\n| variant | verdict vs default | PSNR (dB) | max abs delta |\n|---|---|---|---|")
    for n, item in others.items():
        v = verdict.grade(item["hash"], ref["hash"], item["reference"], ref["reference"])
        print(f"| {n} | {v.level} | {v.psnr:.1f} | {v.max_abs:.3g} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the variants and print the table (``--cost``: the interleaved cost run instead)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="prompts per server for the timing (default 3)")
    p.add_argument("--json", type=Path, help="write the rows as JSON")
    p.add_argument("--cost", type=int, metavar="ROUNDS", help="interleaved portable vs default cost, ROUNDS rounds")
    a = p.parse_args(argv)
    if a.cost:
        return cost(a.cost)
    wf = json.loads(WORKFLOW.read_text())
    ckpt = cached_tiny_sd15(in_subprocess=True)
    items: dict[str, dict] = {}
    timing: dict[str, dict] = {}
    for name, env in SERVERS.items():
        env = portable_env() if env == "portable" else env
        with ComfyServer({CHECKPOINT_NAME: ckpt}, env=env) as srv:
            walls, secs = [], []
            for _ in range(a.repeat if name in ("default", "portable") else 1):
                item, wall, sec = run(srv, wf)
                walls.append(wall)
                secs.append(sec)
            items[name] = item
            timing[name] = {"wall_s": statistics.median(walls), "sampler_s": statistics.median(secs)}
            if name == "default":
                seeded = copy.deepcopy(wf)
                for n in ("6", "7"):
                    seeded[n]["inputs"]["seed"] = 43
                items["default, seed 43"] = run(srv, seeded)[0]
                for prec in ("bf16", "fp16"):
                    try:
                        items[f"default, precision {prec}"] = run(srv, with_optimize(wf, srv, prec))[0]
                    except Exception as e:  # noqa: BLE001 - reported as a row
                        items[f"default, precision {prec}"] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
    ref = items["default"]
    rows = []
    print("| variant | hash | verdict vs default | PSNR (dB) | max abs delta |\n|---|---|---|---|---|")
    for name, item in items.items():
        if "error" in item:
            print(f"| {name} | - | error: {item['error']} | | |")
            continue
        v = verdict.grade(item["hash"], ref["hash"], item["reference"], ref["reference"])
        psnr = "inf" if v.psnr is not None and v.psnr == float("inf") else (f"{v.psnr:.1f}" if v.psnr else "-")
        print(f"| {name} | {item['hash'][:16]} | {v.level} | {psnr} | {v.max_abs:.3g} |")
        rows.append({"variant": name, "hash": item["hash"], **v.as_dict()})
    print("\n| server | prompt wall s (median) | sampler s (median) |\n|---|---|---|")
    for name, t in timing.items():
        print(f"| {name} | {t['wall_s']:.2f} | {t['sampler_s']:.2f} |")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "timing": timing}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
