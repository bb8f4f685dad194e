"""``steadfast`` command line: ``steadfast verify [PIPELINE_DIR | --tiny sd|flux] [options]``,
``steadfast tiny-pipeline DIR``.

Entry point ``main(argv=None) -> int``. Runs as ``steadfast`` (console script), as
``python -m steadfast.headless.verify_cli`` when the pack is importable as ``steadfast``, or via
``scripts/steadfast.py``.

Exit codes: 0 self-consistency held; 1 it did not (or the baseline failed); 2 bad arguments or a
pipeline that cannot be loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser"]


def _size(text: str) -> tuple[int, int]:
    try:
        if "x" in text.lower():
            w, h = text.lower().split("x", 1)
            size = (int(w), int(h))
        else:
            size = (int(text), int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must be N or WxH, got {text!r}") from None
    if min(size) < 8:
        raise argparse.ArgumentTypeError(f"size must be at least 8 pixels, got {text!r}")
    return size


def _positive(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (subcommand ``verify``)."""
    parser = argparse.ArgumentParser(prog="steadfast", description="Steadfast: fast and reproducible diffusion")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser(
        "verify",
        help="self-consistency, parity, grid and benchmark of optimization configs on a pipeline",
        description="Run every configuration on a diffusers pipeline folder (or an embedded tiny one): "
        "N runs must give the same SHA-256; parity against the baseline is measured; a labelled "
        "grid PNG and a JSON report are written; configurations are benchmarked interleaved.",
    )
    src = v.add_mutually_exclusive_group()
    src.add_argument("pipeline_dir", nargs="?", help="diffusers pipeline folder (with model_index.json)")
    src.add_argument("--tiny", choices=("sd", "flux"), help="build a tiny random-weight pipeline instead")
    v.add_argument(
        "--configs",
        default=None,
        help="comma-separated configurations, '+' combines them (default: baseline,qkv,"
        "channels_last,attn-math,vae-slicing,vae-tiling,compile-regional); see --list-configs",
    )
    v.add_argument("--list-configs", action="store_true", help="print the known configuration names and exit")
    v.add_argument("--runs", type=int, default=3, help="runs per configuration for self-consistency (>= 2)")
    v.add_argument("--rounds", type=_positive, default=3, help="interleaved benchmark rounds (0: none)")
    v.add_argument("--steps", type=int, default=4, help="sampling steps")
    v.add_argument("--size", type=_size, default=None, help="N or WxH pixels (tiny default 64)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--batch", type=int, default=1)
    v.add_argument("--prompt", default="a photo of a red fox in the snow")
    v.add_argument("--negative-prompt", default="")
    v.add_argument("--guidance", type=float, default=None, help="guidance scale (default: the pipeline's)")
    v.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    v.add_argument("--device", default="cpu")
    v.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for this process")
    v.add_argument(
        "--deterministic",
        action="store_true",
        help="run every generation under Steadfast's determinism policy (deterministic algorithms, "
        "no TF32; restored afterwards)",
    )
    v.add_argument("--compile-backend", default="inductor", help="torch.compile backend (inductor, eager ...)")
    v.add_argument("--compile-mode", default=None, help="torch.compile mode (inductor presets)")
    v.add_argument(
        "--max-sequence-length", type=int, default=None, help="text length for pipelines that take it (Flux T5)"
    )
    v.add_argument("--out", default="steadfast-verify", help="output folder (report JSON + grid PNG)")
    v.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    v.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    t = sub.add_parser(
        "tiny-pipeline",
        help="write a tiny random-weight diffusers pipeline folder (for the Diffusers template)",
        description="Write the tiny random-weight pipeline the tests use (seeded, a few MB, save_pretrained layout) "
        "to DIR, e.g. ComfyUI/models/diffusers/steadfast-tiny-sd: Load Diffusers Pipeline then lists "
        "it. Its images are noise; it shows that the workflow runs and is reproducible.",
    )
    t.add_argument("out_dir", help="new or empty folder to write")
    t.add_argument("--kind", choices=("sd", "flux"), default="sd")
    t.add_argument("--seed", type=int, default=0)
    return parser


def _tiny_pipeline(args: argparse.Namespace) -> int:
    from . import tiny_pipelines as tiny

    _quiet_libraries()
    build = tiny.build_tiny_sd if args.kind == "sd" else tiny.build_tiny_flux
    try:
        out = build(args.out_dir, seed=args.seed)
    except FileExistsError as e:
        print(f"steadfast tiny-pipeline: {e}", file=sys.stderr)
        return 2
    print(f"wrote the tiny {args.kind} pipeline to {out}")
    return 0


def _quiet_libraries() -> None:
    """This process is ours: silence diffusers'/transformers' own load/save progress bars and info logs,
    so stderr shows only the verify progress bar (a library caller's settings are never touched)."""
    try:
        from diffusers.utils import logging as dlog

        dlog.disable_progress_bar()
        dlog.set_verbosity_error()
    except ImportError:
        pass
    try:
        from transformers.utils import logging as tlog

        tlog.disable_progress_bar()
        tlog.set_verbosity_error()
    except ImportError:
        pass


def _verify(args: argparse.Namespace) -> int:
    from ..core.pipelines import PipelineLoadError
    from .verify import DEFAULT_CONFIGS, VerifySettings, config_names, run_verify

    if args.list_configs:
        print("\n".join(config_names()))
        return 0
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    _quiet_libraries()
    policy = None
    if args.deterministic:
        from ..core.determinism.policy import DeterminismPolicy

        policy = DeterminismPolicy(strict=True)
    settings = VerifySettings(
        pipeline_dir=args.pipeline_dir,
        tiny=args.tiny,
        configs=args.configs or DEFAULT_CONFIGS,
        runs=args.runs,
        rounds=args.rounds,
        steps=args.steps,
        size=args.size,
        seed=args.seed,
        batch=args.batch,
        prompt=args.prompt,
        negative_prompt=args.negative_prompt,
        guidance=args.guidance,
        dtype=args.dtype,
        device=args.device,
        compile_backend=args.compile_backend,
        compile_mode=args.compile_mode,
        out_dir=args.out,
        progress=not args.no_progress,
        policy=policy,
        extra={"max_sequence_length": args.max_sequence_length} if args.max_sequence_length else None,
    )
    try:
        result = run_verify(settings)
    except PipelineLoadError as e:
        print(f"steadfast verify: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"steadfast verify: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.report, indent=1))
    else:
        print(result.table())
        print(f"report: {result.report_path}")
        if result.grid_path is not None:
            print(f"grid:   {result.grid_path}")
    return result.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the subcommand; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "verify" and args.pipeline_dir is None and args.tiny is None and not args.list_configs:
        parser.error("verify needs PIPELINE_DIR or --tiny sd|flux")
    if args.command == "verify":
        return _verify(args)
    if args.command == "tiny-pipeline":
        return _tiny_pipeline(args)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
