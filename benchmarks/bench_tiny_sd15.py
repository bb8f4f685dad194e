"""Sampling time and parity of Steadfast's optimizations on the tiny SD1.5-architecture checkpoint (CPU).

Runs ComfyUI in-process (``args.cpu``), loads the cached tiny checkpoint (``headless/tiny_sd15.py``) with
``comfy.sd.load_checkpoint_guess_config`` and encodes the prompts with its CLIP. Each configuration is a
``ModelPatcher`` clone made by the pack's own node, ``SteadfastOptimizeModel.execute`` (so the benchmark
measures exactly what a user of the node gets: ``optimized_attention_override``, object patches,
ON_PRE_RUN / ON_CLEANUP callbacks, APPLY_MODEL compile wrapper and the compile registry).

Configurations (cumulative; the first is the baseline):

=================  =====================================================================
``comfy``          ComfyUI default: the unpatched model (``attention_sub_quad`` on CPU)
``sdpa``           PyTorch SDPA, backend auto (``attention="auto"``)
``+qkv``           ... + fused q/k/v projections
``+cl``            ... + channels-last conv weights
``+regional``      ... + regional ``torch.compile`` (inductor) of the BasicTransformerBlocks
``+full``          ... + full ``torch.compile`` (inductor) of the diffusion model instead
=================  =====================================================================

Timing: one ``comfy.sample.sample`` call (euler, ``--steps`` steps, CFG ``--cfg`` so each step is one
UNet call on a batch of 2) per measurement. Per size, every configuration is called once (its
"first call", which includes compilation for the compiled ones; compile options are the node's
defaults: dynamic="auto", so the second size recompiles with dynamic shapes) plus ``--warmup`` more
times untimed, then the configurations are timed INTERLEAVED (``A B C ... A B C ...``) in
rounds, so machine load affects all of them alike. Before each round the script waits (at most
``--wait-quiet`` s) until other processes leave the cores idle, and it measures how much of the 2 cores
other processes used during the round ("others' CPU", from ``/proc/stat`` minus this process's CPU
time); only rounds with others' CPU <= ``--max-others`` count as clean (until ``--rounds`` clean ones
or ``--max-rounds`` in all; if fewer than 3 are clean, all rounds are used and the output says so). On a
shared 2-core machine other processes make two-thread OpenMP runs up to 10x slower in bursts, hence this
filter. Reported: min and median seconds per sample, the fastest
single sampler step (from the sampler callback; steps 2..N of each sample, i.e. one UNet call plus the
euler update, without per-run set-up such as the channels-last conversion), and the ratio of the
baseline's time to the configuration's (> 1 = faster).

Parity: the output latent of each configuration's first timed round against the baseline's and
against the previous configuration's (``core.record.compare.compare_outputs``: bytes + max |d|), and
each later round against the configuration's own first one ("rerun bit-equal").

Inductor's cache: a fresh empty folder per run unless ``--cache-dir`` is given (set as
``TORCHINDUCTOR_CACHE_DIR``; the node's ``compile_cache`` input is ``off``, so the user's persistent
Steadfast compile cache is neither used nor written), so the first-call column of the compiled rows is
a cold compile.

Usage::

    python benchmarks/bench_tiny_sd15.py [--sizes 16,32] [--steps 4] [--rounds 5] [--wait-quiet 60]
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

# name -> (qkv_fusion, channels_last, attention, compile); None = the unpatched model
CONFIGS: dict[str, tuple[bool, bool, str, str] | None] = {
    "comfy (sub_quad)": None,
    "sdpa auto": (False, False, "auto", "off"),
    "+qkv": (True, False, "auto", "off"),
    "+qkv +cl": (True, True, "auto", "off"),
    "+qkv +cl +regional": (True, True, "auto", "regional"),
    "+qkv +cl +full": (True, True, "auto", "full"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes",
        default="16,32",
        help="latent sides, comma separated (latent 16 = 128x128 px image, 32 = 256x256 px)",
    )
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--cfg", type=float, default=7.0)
    p.add_argument("--rounds", type=int, default=5, help="clean interleaved timed rounds wanted per size")
    p.add_argument(
        "--max-rounds",
        type=int,
        default=15,
        help="stop after this many rounds per size even if "
        "fewer were clean (then all rounds are used and the table says so)",
    )
    p.add_argument(
        "--max-others",
        type=float,
        default=0.10,
        help="a round is clean when other processes used at most this share of the cores during it",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per config after its first call")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="comma-separated subset of: " + ", ".join(CONFIGS) + " (the first is the baseline)",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=60.0,
        help="before each round, wait up to this many seconds until other processes use < 5%% of the cores (0: never)",
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        help="TORCHINDUCTOR_CACHE_DIR to use (default: a fresh temporary one, i.e. cold compiles)",
    )
    return p.parse_args(argv)


def build_configs(model: Any, names: list[str], cache_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({name: ModelPatcher}, {name: CompileRecord})``: the unpatched model for the baseline, node-made
    clones for the rest; the compile record the node created for each compiled clone (taken right away:
    the registry keeps one record per underlying model, so ``+full`` replaces ``+regional``'s entry,
    while the regional clone's wrapper keeps using its own record)."""
    from steadfast.core.compile import registry
    from steadfast.nodes.optimize_node import SteadfastOptimizeModel

    out: dict[str, Any] = {}
    records: dict[str, Any] = {}
    for name in names:
        spec = CONFIGS[name]
        if spec is None:
            out[name] = model
            continue
        qkv_fusion, channels_last, attention, compile_ = spec
        kwargs = dict(
            qkv_fusion=qkv_fusion,
            channels_last=channels_last,
            attention=attention,
            compile=compile_,
            backend="inductor",
            mode="default",
            dynamic="auto",
            fullgraph=False,
        )
        if "compile_cache" in inspect.signature(SteadfastOptimizeModel.execute).parameters:
            kwargs["compile_cache"] = "off"  # no managed cache: this run's TORCHINDUCTOR_CACHE_DIR (cold) applies
        res = SteadfastOptimizeModel.execute(model, **kwargs)
        out[name] = res.result[0]
        if compile_ != "off":
            records[name] = registry.REGISTRY.get(out[name].model)
        print(f"[{name}] " + res.result[1].replace("\n", "; "), flush=True)
    return out, records


def compile_note(record: Any) -> str:
    """Blocks / graphs / recompiles / graph breaks / eager fallback of a compile record of the pack's registry."""
    if record is None:
        return ""
    s = record.summary()
    breaks = sum(record.stats.graph_breaks.values())
    text = f"{s['blocks']} block(s), graphs {s['graphs']}, recompiles {s['recompiles']}, graph breaks {breaks}"
    if s["disabled"]:
        text += f", DISABLED (fell back to eager): {s['disabled']}"
    return text


def run_size(
    side: int, configs: dict[str, Any], records: dict[str, Any], sample: Callable[..., Any], args: argparse.Namespace
) -> tuple[list[list[Any]], dict[str, str]]:
    """Warm up and time every config at latent ``side`` x ``side``; returns table rows and compile notes."""
    from steadfast.core.record.compare import compare_outputs

    names = list(configs)
    first: dict[str, float] = {}
    for name in names:
        t0 = time.perf_counter()
        sample(configs[name], side)
        first[name] = time.perf_counter() - t0
        for _ in range(args.warmup):
            sample(configs[name], side)
        print(f"  size {side}: {name}: first call {first[name]:.2f} s", flush=True)

    # Interleaved rounds. Before each, wait (up to --wait-quiet s) for idle cores; the other processes'
    # CPU share during each round is measured, and only rounds with share <= --max-others count as clean.
    rounds: list[dict[str, Any]] = []
    ref: dict[str, Any] = {}
    rerun_equal: dict[str, bool] = {n: True for n in names}
    n_clean = 0
    while n_clean < args.rounds and len(rounds) < args.max_rounds:
        _common.wait_for_quiet(args.wait_quiet)
        rnd: dict[str, Any] = {"times": {}, "steps": {}}
        with _common.OthersMeter() as meter:
            for name in names:
                marks: list[float] = []
                t0 = time.perf_counter()
                out = sample(configs[name], side, marks)
                rnd["times"][name] = time.perf_counter() - t0
                # callback marks follow each step; step 1 also holds the run's set-up, so it is left out
                rnd["steps"][name] = [b - a for a, b in zip(marks, marks[1:])]
                if name not in ref:
                    ref[name] = out
                elif not compare_outputs(ref[name], out).bit_equal:
                    rerun_equal[name] = False
        rnd["others"] = meter.share
        rnd["clean"] = meter.share is None or meter.share <= args.max_others
        n_clean += rnd["clean"]
        rounds.append(rnd)
        share = "n/a" if meter.share is None else f"{meter.share:.0%}"
        print(
            f"  size {side}: round {len(rounds)} (others' CPU {share}, "
            f"{'clean' if rnd['clean'] else 'contended'}): " + ", ".join(f"{n} {rnd['times'][n]:.3f}" for n in names),
            flush=True,
        )
    used = [r for r in rounds if r["clean"]]
    if len(used) < min(3, args.rounds):
        used = rounds
        how = f"ALL {len(rounds)} rounds (only {n_clean} clean: timings CONTENDED)"
    else:
        how = f"{len(used)} clean rounds of {len(rounds)}"
    times = {n: [r["times"][n] for r in used] for n in names}
    steps = {n: [t for r in used for t in r["steps"][n]] for n in names}
    others = [r["others"] for r in used if r["others"] is not None]
    how += f" (clean: others' CPU <= {args.max_others:.0%}; mean others' CPU in the rounds used " + (
        f"{sum(others) / len(others):.0%})" if others else "n/a)"
    )

    base = names[0]
    bmin, bmed = _common.summarize(times[base])
    bstep = min(steps[base])
    rows = []
    notes = {}
    for i, name in enumerate(names):
        tmin, tmed = _common.summarize(times[name])
        smin = min(steps[name])
        par = compare_outputs(ref[base], ref[name])
        prev = compare_outputs(ref[names[i - 1]], ref[name]) if i else par
        rows.append(
            [
                f"{side}x{side}",
                name,
                _common.fmt_s(first[name], 2),
                _common.fmt_s(tmin),
                _common.fmt_s(tmed),
                _common.fmt_s(smin),
                f"{bmin / tmin:.2f}x",
                f"{bmed / tmed:.2f}x",
                f"{bstep / smin:.2f}x",
                "yes" if par.bit_equal else "no",
                _common.fmt_d(par.max_abs),
                "-" if not i else ("yes" if prev.bit_equal else f"no ({_common.fmt_d(prev.max_abs)})"),
                "yes" if rerun_equal[name] else "NO",
            ]
        )
        text = compile_note(records.get(name))
        if text:
            notes[name] = text
    notes["_rounds"] = how
    return rows, notes


def load_and_sampler(ckpt: Path, args: argparse.Namespace) -> tuple[Any, Callable[..., Any]]:
    """``(MODEL, sample)``: the checkpoint's ModelPatcher and ``sample(patcher, side, marks=None)``, one
    ``comfy.sample.sample`` call (euler/normal, ``args.steps``/``args.cfg``/``args.seed``, a fixed prompt) on a
    ``1 x 4 x side x side`` zero latent; ``marks`` collects one ``perf_counter`` per step. Call inside inference
    mode."""
    import torch

    import comfy.sample
    import comfy.sd

    model, clip, _, _ = comfy.sd.load_checkpoint_guess_config(str(ckpt), output_vae=False, output_clip=True)
    pos = clip.encode_from_tokens_scheduled(clip.tokenize("a red fox in the snow, photograph"))
    neg = clip.encode_from_tokens_scheduled(clip.tokenize(""))

    def sample(patcher: Any, side: int, marks: list[float] | None = None) -> torch.Tensor:
        latent = torch.zeros(1, 4, side, side)
        noise = comfy.sample.prepare_noise(latent, args.seed)
        callback = None if marks is None else (lambda *_: marks.append(time.perf_counter()))
        return comfy.sample.sample(
            patcher,
            noise,
            args.steps,
            args.cfg,
            "euler",
            "normal",
            pos,
            neg,
            latent,
            seed=args.seed,
            disable_pbar=True,
            callback=callback,
        )

    return model, sample


def run_sizes(
    sizes: list[int],
    configs: dict[str, Any],
    records: dict[str, Any],
    sample: Callable[..., Any],
    args: argparse.Namespace,
) -> tuple[list[list[Any]], dict[str, list[str]]]:
    """:func:`run_size` for each latent side: the table rows and the notes (timing rounds, compile states)."""
    rows: list[list[Any]] = []
    notes: dict[str, list[str]] = {}
    for side in sizes:
        r, n = run_size(side, configs, records, sample, args)
        rows += r
        for k, v in n.items():
            notes.setdefault(k, []).append(f"{side}x{side}: {v}" if k == "_rounds" else f"after {side}x{side}: {v}")
    return rows, notes


def names_and_sizes(args: argparse.Namespace, known: Any) -> tuple[list[str], list[int]]:
    """``--configs`` as names (``SystemExit`` naming any not in ``known``) and ``--sizes`` as ints."""
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown config(s) {unknown}; choose from {list(known)}")
    return names, [int(s) for s in args.sizes.split(",") if s.strip()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names, sizes = names_and_sizes(args, CONFIGS)

    tmp_cache = None
    if args.cache_dir is None:
        tmp_cache = tempfile.mkdtemp(prefix="steadfast_bench_inductor_")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp_cache
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(args.cache_dir).expanduser())
    t_start = time.perf_counter()
    try:
        _common.import_pack()
        import torch

        ckpt = _common.tiny_sd15_module().cached_tiny_sd15()
        _common.print_header(
            "bench_tiny_sd15",
            {
                "checkpoint": f"{ckpt.name} (tiny SD1.5 architecture, random seeded weights, UNet fp32 on CPU)",
                "sampling": f"euler / normal, {args.steps} steps, cfg {args.cfg} (UNet batch 2), seed {args.seed}",
                "timing": f"{args.rounds} clean interleaved rounds per size wanted (at most {args.max_rounds}; "
                f"clean = other processes used <= {args.max_others:.0%} of the cores) after 1 first call + "
                f"{args.warmup} warm-up call(s)",
                "inductor cache": "fresh empty dir (cold)" if tmp_cache else os.environ["TORCHINDUCTOR_CACHE_DIR"],
            },
        )
        with torch.inference_mode():  # as ComfyUI's prompt executor runs nodes
            model, sample = load_and_sampler(ckpt, args)
            configs, records = build_configs(model, names, os.environ["TORCHINDUCTOR_CACHE_DIR"])
            rows, notes = run_sizes(sizes, configs, records, sample, args)
    finally:
        if tmp_cache is not None:
            shutil.rmtree(tmp_cache, ignore_errors=True)

    print()
    print(
        _common.markdown_table(
            [
                "latent",
                "config",
                "first call s",
                "sample min s",
                "sample median s",
                "step min s",
                "speedup (sample min)",
                "speedup (sample median)",
                "speedup (step min)",
                "bit-equal to baseline",
                "max abs diff vs baseline",
                "bit-equal to previous row (max abs diff)",
                "rerun bit-equal",
            ],
            rows,
        )
    )
    print()
    print("- timings from: " + "; ".join(notes.pop("_rounds", [])))
    for name, lines in notes.items():
        print(f"- compile state of `{name}`: " + "; ".join(lines))
    print(
        "\nspeedup = baseline time / config time (> 1 is faster). sample = one comfy.sample.sample call; "
        "step min = fastest single sampler step (steps 2..N of every timed sample, from the sampler callback; "
        "one UNet call on batch 2 plus the euler update), the least load-sensitive number."
    )
    _common.print_footer(t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
