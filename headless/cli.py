"""The ``steadfast`` command: ``steadfast run WORKFLOW ...`` (headless verifier), ``steadfast verify ...``
(diffusers pipelines, :mod:`headless.verify_cli`) and ``steadfast artifact ...`` (compile artifacts,
:mod:`headless.artifact_cli`).

``steadfast run WORKFLOW [--server URL ...] [--api auto|native|v2] [--token-env NAME] [--runs N] [--free-between]
[--restart] [--pin OUT.json] [--json REPORT] [--ckpt FILE ...]``: WORKFLOW is an API-format JSON or a PNG saved by
ComfyUI. A ``--server`` is a ComfyUI (native ``/prompt``) or a Comfy API v2 base URL (``comfy-api-proxy``, Comfy
Cloud, serverless: :mod:`headless.v2`), told apart by ``GET /api/v2/health`` unless ``--api`` says; a v2 bearer
token is read from the environment variable ``--token-env`` names (default ``COMFY_API_KEY``), never from the
command line. Every run is a fresh execution (no node served from ComfyUI's cache), and the report says how. Without
``--server`` a headless ComfyUI (``--cpu``, 127.0.0.1, this pack loaded; ``$COMFYUI_PATH`` or
``~/comfy/ComfyUI``) is started for the run; ``--ckpt`` files are linked into its ``models/checkpoints`` and
every ``CheckpointLoaderSimple`` is pointed at the first one; a workflow that names the embedded tiny
checkpoint gets it built (seeded, nothing downloaded). ``--portable`` starts it in portable CPU mode
(:mod:`core.determinism.portable`). Exit codes: 0 identical bytes (every run, and every pinned ``expected``); 3 the
bytes differ but every output is the same picture within tolerance (:mod:`core.record.verdict`: PSNR of the thumbnails
against the first run or the pinned ``expected_reference``); 1 a different picture, or bytes that differ with
nothing to grade them by, or batch items without a reference thumbnail whose bytes differ ("ungraded"), or a
failed run; 2 the workflow or a server could not be used, or portable mode refused a setting or a node whose
bits free memory would decide (message says why).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import runner

__all__ = ["main", "run_main", "build_run_parser"]

TINY_NAME = "steadfast_tiny_sd15.safetensors"


def build_run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="steadfast run",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("workflow", type=Path, help="API-format workflow JSON, or a PNG saved by ComfyUI")
    p.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="URL",
        help="a running ComfyUI, or a Comfy API v2 base URL (repeatable: every run is done on every server); "
        "default: start one",
    )
    p.add_argument(
        "--api",
        choices=("auto", "native", "v2"),
        default="auto",
        help="how to speak to each --server: v2 (the Comfy API v2, with comfy-sdk), native (ComfyUI's /prompt), "
        "or auto (v2 where GET /api/v2/health answers, else native; the default)",
    )
    p.add_argument(
        "--token-env",
        default="COMFY_API_KEY",
        metavar="NAME",
        help="environment variable holding the Comfy API v2 bearer token (default COMFY_API_KEY; unset: no token)",
    )
    p.add_argument("--token", help=argparse.SUPPRESS)  # refused with a reason (run_main)
    p.add_argument("--runs", type=int, default=2, help="runs per server (default 2)")
    p.add_argument(
        "--free-between",
        action="store_true",
        help="also unload the models between runs (every run recomputes every node anyway)",
    )
    p.add_argument("--restart", action="store_true", help="restart the started server and run once more")
    p.add_argument(
        "--pin",
        type=Path,
        metavar="OUT.json",
        help="write the workflow with the observed hashes and run records in its Hash nodes",
    )
    p.add_argument("--json", type=Path, metavar="REPORT", help="write the report as JSON")
    p.add_argument(
        "--ckpt",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="checkpoint for the started server (repeatable; the first is used by the workflow)",
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per prompt (default 1800)")
    p.add_argument(
        "--portable",
        action="store_true",
        help="portable CPU mode: start ComfyUI with every CPU setting that decides its code paths pinned "
        "(ATen AVX2 kernels, oneDNN off, MKL_CBWR=COMPATIBLE,STRICT, fixed threads), so any x86-64 "
        "CPU with AVX2 gives the same bytes; compile, quantize and bf16/fp16 are refused, and so is "
        "a workflow whose bits free memory would decide (stock samplers without Determinism "
        "Setup's batch_invariant, ComfyUI's VAE Decode / Encode) (core/determinism/portable.py, "
        "docs/reproducing.md)",
    )
    p.add_argument(
        "--portable-threads",
        type=int,
        default=1,
        metavar="N",
        help="threads in portable mode (default 1; every machine must use the same N)",
    )
    return p


def _start_server(prompt: dict[str, Any], ckpts: list[Path], env: dict[str, str] | None = None) -> Any:
    from .comfy_server import ComfyServer, find_comfyui

    comfy = find_comfyui()
    if comfy is None:
        raise runner.WorkflowError("ComfyUI not found: set COMFYUI_PATH (default ~/comfy/ComfyUI) or pass --server")
    files: dict[str, Path] = {}
    for c in ckpts:
        if not c.is_file():
            raise runner.WorkflowError(f"checkpoint not found: {c}")
        files[c.name] = c.resolve()
    if ckpts:
        for node in prompt.values():
            if node.get("class_type") == "CheckpointLoaderSimple":
                node.setdefault("inputs", {})["ckpt_name"] = ckpts[0].name
    elif any(n.get("inputs", {}).get("ckpt_name") == TINY_NAME for n in prompt.values()):
        from .tiny_sd15 import cached_tiny_sd15

        files[TINY_NAME] = cached_tiny_sd15(in_subprocess=True)
        print(f"checkpoint: embedded tiny SD1.5-architecture model (seeded random weights) {files[TINY_NAME]}")
    server = ComfyServer(files, comfyui=comfy, env=env).start()
    failures = server.import_failures()
    if failures:
        server.close()
        raise runner.WorkflowError("the Steadfast pack failed to import in ComfyUI:\n" + "\n".join(failures))
    return server


def _portable_env(threads: int) -> dict[str, str]:
    from ..core.determinism import portable

    try:
        portable.check_cpu()
        env = portable.portable_env(threads)
    except (portable.PortableModeError, ValueError) as e:
        raise runner.WorkflowError(str(e)) from None
    print("portable CPU mode: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
    return env


def _remote(url: str, api: str = "native", token_env: str = "COMFY_API_KEY") -> Any:
    if api == "v2" or (api == "auto" and _is_v2(url)):
        from .v2 import V2Server, token_from_env

        server = V2Server(url, token_from_env(token_env), token_env)
        try:
            print(f"server {server.check()}")
        except runner.WorkflowError:
            server.close()
            raise
        return server
    from .comfy_server import ComfyClient

    client = ComfyClient(url)
    try:
        stats = client.get("/system_stats", timeout=10)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise runner.WorkflowError(f"cannot reach ComfyUI at {url}: {getattr(e, 'reason', e)}") from None
    print(f"server {url}: ComfyUI {stats.get('system', {}).get('comfyui_version', '?')}")
    return client


def _is_v2(url: str) -> bool:
    from .v2 import is_v2

    try:
        return is_v2(url)
    except ImportError:  # httpx (comfy-sdk's) missing: only the native API can be spoken
        return False
    except runner.WorkflowError:
        return False  # unreachable: the native probe says so in its own words


def run_main(argv: Sequence[str]) -> int:
    args = build_run_parser().parse_args(list(argv))
    started = None
    servers: list[Any] = []
    if args.token is not None:
        print(
            "steadfast run: a token never goes on the command line (it would show in the process list and the "
            "shell history): put it in an environment variable and name that with --token-env "
            "(default COMFY_API_KEY)",
            file=sys.stderr,
        )
        return 2
    try:
        prompt = runner.load_workflow(args.workflow)
        runner.hash_nodes(prompt)
        if args.restart and args.server:
            raise runner.WorkflowError("--restart needs a server started by steadfast run (leave out --server)")
        if args.ckpt and args.server:
            raise runner.WorkflowError("--ckpt is for the started server; a --server uses its own model folders")
        if args.portable and args.server:
            raise runner.WorkflowError(
                "--portable starts its own server with the pinned settings; a --server "
                "was started by someone else (start it by the recipe in "
                "docs/reproducing.md and its run records say whether it is portable)"
            )
        if args.portable:
            from ..core.determinism import portable

            refusals = portable.free_memory_refusals(prompt)
            if refusals:
                raise runner.WorkflowError(
                    "portable CPU mode refuses this workflow: ComfyUI would let free memory "
                    "decide some of its bits:\n  " + "\n  ".join(refusals)
                )
        env = _portable_env(args.portable_threads) if args.portable else None
        if args.server:
            for u in args.server:
                servers.append(_remote(u, args.api, args.token_env))
            if args.free_between and any(getattr(s, "api", "native") == "v2" for s in servers):
                raise runner.WorkflowError(
                    "--free-between unloads models with ComfyUI's /free, which the Comfy API v2 does not have "
                    "(every v2 run is a fresh execution anyway)"
                )
        else:
            started = _start_server(prompt, args.ckpt, env)
            servers = [started]
        report = runner.run_all(
            prompt, servers, runs=args.runs, free_between=args.free_between, restart=args.restart, timeout=args.timeout
        )
    except runner.WorkflowError as e:
        print(f"steadfast run: {e}", file=sys.stderr)
        return 2
    finally:
        if started is not None:
            started.close()
        for s in servers:
            if hasattr(s, "close") and s is not started:
                s.close()
    print("\n" + report.as_text())
    if args.json:
        args.json.write_text(json.dumps(report.as_dict(), indent=1, default=str), encoding="utf-8")
    if args.pin:
        first = next((r for r in report.results if r.error is None and r.hashes), None)
        if first is None:
            print("steadfast run: nothing to pin (no run produced hashes)", file=sys.stderr)
            return 1
        args.pin.write_text(json.dumps(runner.pin(prompt, first), indent=1), encoding="utf-8")
        print(f"pinned: {args.pin}")
    refused = [r.error for r in report.results if r.error and "portable CPU mode refuses" in r.error]
    if refused:
        print(f"steadfast run: {refused[0]}", file=sys.stderr)
        return 2
    return report.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """``steadfast run ...`` here, ``steadfast artifact ...`` to :func:`headless.artifact_cli.main`; every other
    subcommand (``verify``, ``tiny-pipeline``) goes to :func:`headless.verify_cli.main`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "run":
        return run_main(args[1:])
    if args and args[0] == "artifact":
        from .artifact_cli import main as artifact_main

        return artifact_main(args[1:])
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: steadfast {run,verify,artifact,tiny-pipeline} ...\n\n"
            "  run     run a ComfyUI workflow headless and check its hashes (steadfast run --help)\n"
            "  verify  self-consistency, parity and speed of optimizations on a diffusers pipeline "
            "(steadfast verify --help)\n"
            "  artifact  export/import/inspect a compile artifact: the warm compile cache as one file for a "
            "fleet (steadfast artifact --help)\n"
            "  tiny-pipeline  write a tiny random-weight diffusers pipeline folder, e.g. into models/diffusers "
            "(steadfast tiny-pipeline --help)"
        )
        return 0 if args else 2
    from .verify_cli import main as core_main

    return core_main(args)


if __name__ == "__main__":
    sys.exit(main())
