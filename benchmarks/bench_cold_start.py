"""First run of a workflow in a fresh ComfyUI: Steadfast's regional compile vs core's TorchCompileModel.

The tiny SD1.5-architecture checkpoint (``headless/tiny_sd15.py``) through stock nodes (CheckpointLoaderSimple,
CLIPTextEncode, EmptyLatentImage, KSampler euler, VAEDecode, PreviewImage), the MODEL passed through one of:

* ``eager``: nothing (ComfyUI's own attention);
* ``core``: core ComfyUI's ``TorchCompileModel`` (backend inductor: the whole diffusion model);
* ``steadfast``: ``SteadfastOptimizeModel`` (compile regional, inductor, SDPA auto; the node's defaults otherwise);
* ``steadfast-jit``: the same with ``STEADFAST_PRECOMPILED=0`` (warm start through inductor's caches only, Dynamo
  traces again: the route before precompiled blocks);
* ``eager-preload``: ``eager`` with ``$STEADFAST_PRELOAD_COMPILE=1``: the pack's work at start (the compile stack's
  import, inductor's CPU ISA pick, the heap frozen: :mod:`core.compile.warm.preload`) without compiling anything, the
  floor a warm Steadfast start is measured against when the start-up work is set aside;
* ``steadfast-probe``: the same with ``STEADFAST_PROBE_CPU_ISA=1`` (inductor probes every CPU vector ISA by
  building and loading a C++ test program, as it does by default; see ``core.torch_compat.trusted_cpu_isa``).

Each (config, cache state) runs in a FRESH server process: ``cold`` with empty inductor and Steadfast cache
folders (the first compile ever on the machine), ``warm`` with the folders the cold server left (a restart of the
same install).
After ``steadfast``'s warm server, ``steadfast-artifact``: its compile cache exported as one file (``steadfast
artifact export``) and the same install restarted on EMPTY cache folders with ``$STEADFAST_COMPILE_ARTIFACT``
naming it (another replica of the same image) and a fresh ``TMPDIR`` (a fresh machine: nothing in inductor's
default folder, where it keeps its precompiled headers and its ISA test programs); its row is "warm".
The first prompt's wall seconds (queue -> done: model load, compile, sampling, decode) is the number; a second
prompt with another seed gives the steady-state time; ``start`` is the server's start (or restart) until it
answers. Ratios are printed against ``core`` for the same cache state.

Usage: ``python benchmarks/bench_cold_start.py [--configs eager,core,steadfast,steadfast-jit] [--steps 4]
[--side 256] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common._scripts_on_path()
from comfy_server import ComfyServer  # noqa: E402

tiny_sd15 = _common.tiny_sd15_module()
CKPT = "steadfast_tiny_sd15.safetensors"


def workflow(config: str, seed: int, steps: int, side: int) -> dict[str, Any]:
    """The API-format prompt for ``config`` (see the module docstring)."""
    wf: dict[str, Any] = {
        **_common.tiny_prompt_base(side, ckpt=CKPT),
        "6": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["1", 0] if config.startswith("eager") else ["5", 0],
                "seed": seed,
                "steps": steps,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "positive": ["2", 0],
                "negative": ["3", 0],
                "latent_image": ["4", 0],
                "denoise": 1.0,
            },
        },
        "7": {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["1", 2]}},
        "8": {"class_type": "PreviewImage", "inputs": {"images": ["7", 0]}},
    }
    if config == "core":
        wf["5"] = {"class_type": "TorchCompileModel", "inputs": {"model": ["1", 0], "backend": "inductor"}}
    elif config.startswith("steadfast"):
        wf["5"] = _common.optimize_node(["1", 0])
    return wf


def server_env(config: str, caches: Path, artifact: Path | None = None) -> dict[str, str]:
    """The server's environment for ``config`` with its caches under ``caches`` (``artifact``: imported at start,
    ``$STEADFAST_COMPILE_ARTIFACT``)."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"), "STEADFAST_COMPILE_CACHE": str(caches / "steadfast")}
    if config == "eager-preload":
        env["STEADFAST_PRELOAD_COMPILE"] = "1"
    if config == "steadfast-probe":
        env["STEADFAST_PROBE_CPU_ISA"] = "1"
    if config == "steadfast-jit":
        env["STEADFAST_PRECOMPILED"] = "0"
    if artifact is not None:
        import hashlib

        env["STEADFAST_COMPILE_ARTIFACT"] = str(artifact)  # pinned, as an operator's (unpinned ones are refused)
        env["STEADFAST_COMPILE_ARTIFACT_SHA256"] = hashlib.sha256(artifact.read_bytes()).hexdigest()
        (caches / "tmp").mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(caches / "tmp")
    return env


def timed_prompts(
    server: ComfyServer, config: str, steps: int, side: int, start: float
) -> tuple[float, float, float, float]:
    """``(first prompt s, second prompt s, start s, first prompt s by the server's timestamps)`` in a server just
    (re)started in ``start`` seconds."""
    times, executed = [], []
    for seed in (1, 2):
        t0 = time.perf_counter()
        entry = server.wait(server.queue(workflow(config, seed, steps, side)), timeout=900)
        times.append(time.perf_counter() - t0)
        executed.append(_common.executed_seconds(entry))
    return times[0], times[1], start, executed[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="eager,core,steadfast,steadfast-jit")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--side", type=int, default=256, help="image side in pixels (latent side / 8)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    t_start = time.perf_counter()
    _common.print_header(
        "Cold and warm first run in ComfyUI: Steadfast regional vs core TorchCompileModel",
        {"steps": args.steps, "side": args.side, "repeats": args.repeats},
    )
    ckpt = tiny_sd15.cached_tiny_sd15(in_subprocess=True)
    configs = args.configs.split(",")
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for _ in range(args.repeats):
        for config in configs:
            with tempfile.TemporaryDirectory(prefix=f"bench_cold_{config}_") as tmp:
                # one install folder for every start of this config: a restart, as an operator's (ComfyUI names a
                # custom node's modules by its folder, and precompiled blocks refer to them by that name)
                server = ComfyServer({CKPT: ckpt}, env=server_env(config, Path(tmp)))
                try:
                    for state in ("cold", "warm"):
                        t0 = time.perf_counter()
                        server.restart() if state == "warm" else server.start()
                        results.setdefault((config, state), []).append(
                            timed_prompts(server, config, args.steps, args.side, time.perf_counter() - t0)
                        )
                        print(
                            f"  {config} {state}: first {results[config, state][-1][0]:.1f} s, "
                            f"second {results[config, state][-1][1]:.2f} s",
                            flush=True,
                        )
                    if config == "steadfast":  # another replica of the image: empty caches, this one's artifact
                        artifact = Path(tmp) / "warm.steadfast.tar.gz"
                        cli = str(_common.ROOT / "scripts" / "steadfast.py")
                        subprocess.run(
                            [
                                sys.executable,
                                cli,
                                "artifact",
                                "export",
                                "--name",
                                "default",
                                "--cache-root",
                                str(Path(tmp) / "steadfast"),
                                "--device",
                                "cpu",
                                "-o",
                                str(artifact),
                            ],
                            check=True,
                            capture_output=True,
                            timeout=300,
                        )
                        server.env = server_env(config, Path(tmp) / "replica", artifact)
                        t0 = time.perf_counter()
                        server.restart()
                        started = time.perf_counter() - t0
                        imported = server.get("/steadfast/compile_state").get("artifacts", [])
                        if not any(a.get("status") == "imported" for a in imported):
                            raise RuntimeError(f"the artifact was not imported at start: {imported}")
                        key = ("steadfast-artifact", "warm")
                        results.setdefault(key, []).append(
                            timed_prompts(server, config, args.steps, args.side, started)
                        )
                        print(
                            f"  steadfast-artifact warm: first {results[key][-1][0]:.1f} s, "
                            f"second {results[key][-1][1]:.2f} s",
                            flush=True,
                        )
                finally:
                    server.close()
    rows = []
    eager = results.get(("eager", "cold"))
    eager_first = statistics.median(r[0] for r in eager) if eager else None
    eager_exec = statistics.median(r[3] for r in eager) if eager else None
    core_warm = results.get(("core", "warm"))
    core_exec = statistics.median(r[3] for r in core_warm) if core_warm else None
    for (config, state), runs in results.items():
        first = statistics.median(r[0] for r in runs)
        second = statistics.median(r[1] for r in runs)
        core = results.get(("core", state))
        ratio = first / statistics.median(r[0] for r in core) if core else None
        if config == "steadfast-artifact":  # against core's warm start: both skip compiling
            core = results.get(("core", "warm"))
            ratio = first / statistics.median(r[0] for r in core) if core else None
        cold = results.get((config, "cold"))
        start = statistics.median(r[2] for r in runs)
        rows.append(
            [
                config,
                state,
                f"{start:.1f}",
                f"{first:.1f}",
                ", ".join(f"{r[0]:.1f}" for r in runs),
                f"{second:.2f}",
                f"{ratio:.2f}" if ratio is not None else "n/a",
                f"{first / statistics.median(r[0] for r in cold):.2f}" if state == "warm" and cold else "-",
                f"{first / eager_first:.1f}" if eager_first else "n/a",
                f"{(ex := statistics.median(r[3] for r in runs)):.2f}",
                f"{ex / eager_exec:.2f}" if eager_exec else "n/a",
                f"{ex / core_exec:.2f}" if core_exec else "n/a",
            ]
        )
    print()
    print(
        _common.markdown_table(
            [
                "config",
                "cache",
                "start s",
                "first prompt s (median)",
                "each repeat",
                "second prompt s",
                "first / core's first",
                "warm / cold",
                "first / eager's first",
                "first, server's timestamps s",
                "/ eager's first (timestamps)",
                "/ core's warm first (timestamps)",
            ],
            rows,
        )
    )
    print(
        "\nstart = the server's start or restart until it answers; first prompt = wall seconds queue -> done in a "
        "fresh server (checkpoint load, compile, sampling, decode); second prompt = the same workflow with another "
        "seed in the same server (no compile); steadfast-artifact is compared with core's warm start; "
        "timestamps = the server's own execution_start -> execution_success of the first prompt."
    )
    _common.print_footer(t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
