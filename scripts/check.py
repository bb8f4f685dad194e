"""Steadfast's main job: a headless ComfyUI determinism check over the HTTP API.

Starts ComfyUI (``--cpu``) on 127.0.0.1 with this pack loaded, posts the
``determinism_check`` workflow (API format) twice with ComfyUI's caches freed in between
(``POST /free``), restarts the server and posts it again. Prints every run's image hash and the
in-workflow Compare verdict, then the overall verdict. Exit code 0 = all hashes identical, 1 = not,
2 = could not run.

    python scripts/check.py                       # embedded tiny SD1.5-architecture checkpoint
    python scripts/check.py --ckpt model.safetensors --steps 20 --size 512
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from comfy_server import ComfyServer, find_comfyui  # noqa: E402

WORKFLOW = ROOT / "example_workflows" / "api" / "determinism_check.json"


def build_prompt(ckpt_name: str, args) -> dict:
    wf = json.loads(WORKFLOW.read_text())
    wf["1"]["inputs"]["ckpt_name"] = ckpt_name
    wf["4"]["inputs"].update(width=args.size, height=args.size, batch_size=args.batch)
    for nid in ("6", "7"):
        wf[nid]["inputs"].update(seed=args.seed, steps=args.steps, sampler_name=args.sampler)
    if args.prompt:
        wf["2"]["inputs"]["text"] = args.prompt
    return wf


def run_once(server: ComfyServer, prompt: dict) -> dict:
    t0 = time.perf_counter()
    outputs = server.run(prompt)
    seconds = time.perf_counter() - t0
    hash_ui = outputs["11"]["steadfast_hash"][0]
    compare_ui = outputs["10"]["steadfast_compare"][0]
    return {"hash": hash_ui["hash"], "in_workflow_identical": bool(compare_ui["identical"]), "seconds": round(seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", type=Path, help="checkpoint file (default: the embedded tiny SD1.5-architecture model)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--size", type=int, default=64, help="image width = height in pixels")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--sampler", default="euler_ancestral")
    p.add_argument("--prompt", default=None)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)

    comfy = find_comfyui()
    if comfy is None:
        print("ComfyUI not found: set COMFYUI_PATH (default ~/comfy/ComfyUI). scripts/setup_env.sh installs it.",
              file=sys.stderr)
        return 2
    if args.ckpt is None:
        from tiny_sd15 import cached_tiny_sd15
        ckpt = cached_tiny_sd15()
        ckpt_name = "steadfast_tiny_sd15.safetensors"
        print(f"checkpoint: embedded tiny SD1.5-architecture model ({ckpt})")
    else:
        ckpt = args.ckpt.resolve()
        if not ckpt.is_file():
            print(f"checkpoint not found: {ckpt}", file=sys.stderr)
            return 2
        ckpt_name = ckpt.name
        print(f"checkpoint: {ckpt}")
    prompt = build_prompt(ckpt_name, args)

    runs = []
    with ComfyServer(checkpoints={ckpt_name: ckpt}, comfyui=comfy) as server:
        failures = server.import_failures()
        if failures:
            print("this pack failed to import in ComfyUI:\n" + "\n".join(failures), file=sys.stderr)
            return 2
        stats = server.get("/system_stats")["system"]
        print(f"ComfyUI {stats.get('comfyui_version')} at {server.url} (--cpu, torch {stats.get('pytorch_version')})")
        runs.append({"run": "1", **run_once(server, prompt)})
        server.free()
        runs.append({"run": "2 (after /free)", **run_once(server, prompt)})
        server.restart()
        runs.append({"run": "3 (after restart)", **run_once(server, prompt)})

    print(f"\n{'run':<20} {'image sha256':<66} {'A==B in workflow':<17} seconds")
    for r in runs:
        print(f"{r['run']:<20} {r['hash']:<66} {str(r['in_workflow_identical']):<17} {r['seconds']}")
    hashes = {r["hash"] for r in runs}
    ok = len(hashes) == 1 and all(r["in_workflow_identical"] for r in runs)
    verdict = ("PASS: identical bytes in every run (2 runs with caches freed, 1 after a server restart)"
               if ok else "FAIL: outputs differ between runs - compare the run records (threads, attention, device)")
    print("\n" + verdict)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "verdict": verdict, "pass": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
