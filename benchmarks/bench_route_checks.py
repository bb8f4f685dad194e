"""What the precompiled route's per-call checks cost, quiet and right after a block's kernels.

The route (:mod:`core.compile.warm.precompiled`) checks every block call before a loaded artifact answers it: the
call's locals (the binder), then one tree of C++ guards evaluated with those locals (``Answer.combined``): a copy of
the artifact's own guard tree with the pack's checks added as leaves (the traced code's identity, the carried guards
and the hooks the route cannot run); the hook walk (:func:`~core.compile.warm.precompiled.hooks_reason`) and the call
key (:func:`~core.compile.warm.precompiled.call_key`) only when the block's last answer misses. Beside them, for
reference: the jit's own Dynamo guard check of the same block (the goal of issue 45: the route's checks <= 2x it), the
key, and the checks as they ran before (two trees of their own; Python; ``guard_check`` with its signature binding).
This benchmark takes one real block call of the tiny SD1.5 checkpoint in ComfyUI (its regional block, a
``BasicTransformerBlock``, captured during a steady sampling call of a warm-started process, so an artifact answers it)
and times each check side by side:

* ``quiet``: the check alone, repeated (``timeit``, the best of 5 x 2,000): its instruction cost, everything in
  the CPU's caches;
* ``after kernel``: the check right after the block's artifact ran (median of 30): the cost it has inside a
  sampling run, where the block's kernels (conv, matmul, attention over all cores) have just evicted the
  interpreter's code and data from the caches;
* ``paired``: the route's checks (binder and tree) and the jit's guard check timed in turn, 31 rounds of 1,000
  calls, the median ratio with its quartiles: the machine's drift between two ``quiet`` rows falls on both sides;
* ``in a run``: the route's own split (``split_seconds`` of the compile record, :data:`~core.compile.warm.precompiled.
  SPLIT_PHASES`: ``carried`` is the binder, ``guard_check`` the one tree) over 10
  steady sampling calls, per block call.

The ratio ``after kernel / quiet`` says how much of the per-call cost is the checks' instructions and how much the
machine's state after a kernel: a check made 2x cheaper in ``quiet`` saves less than half in a run.

Two processes: the first compiles and saves the precompiled blocks into a fresh compile cache, the second (a warm
start on that cache) measures.

Usage: ``python benchmarks/bench_route_checks.py [--side 64] [--steps 4]``; run it with each ComfyUI row's venv and
``COMFYUI_PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

CHILD = r"""
import json, os, statistics, sys, time, timeit
sys.path.insert(0, sys.argv[1])
import _common
tiny = _common.tiny_sd15_module()
_common.import_pack()
mode, ckpt, steps, side = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
import torch
from pathlib import Path
from steadfast.core.compile.warm import precompiled as pc, preload
from steadfast.core.compile.registry import REGISTRY
from steadfast.nodes import optimize_node
preload.preload(Path(os.environ["STEADFAST_COMPILE_CACHE"]))
import comfy.sd, comfy.sample
model, clip, _vae, _ = comfy.sd.load_checkpoint_guess_config(ckpt, output_vae=True, output_clip=True)
pos, neg = (clip.encode_from_tokens_scheduled(clip.tokenize(t)) for t in ("a lighthouse at dusk", ""))
model = optimize_node.SteadfastOptimizeModel.execute(
    model=model, qkv_fusion=False, channels_last=False, attention="auto", compile="regional", backend="inductor",
    mode="default", dynamic="auto", fullgraph=False).args[0]

def sample(seed):
    latent = torch.zeros(1, 4, side // 8, side // 8)
    noise = comfy.sample.prepare_noise(latent, seed)
    return comfy.sample.sample(model, noise, steps, 7.0, "euler", "normal", pos, neg, latent, denoise=1.0, seed=seed)

out1, out2 = sample(1), sample(2)
if mode == "populate":
    print("RESULT " + json.dumps({"depends_on_seed": not torch.equal(out1, out2)}))
    sys.exit(0)
record = REGISTRY.records()[-1]
before = record.summary()["precompiled"]
for i in range(10):
    sample(10 + i)
after = record.summary()["precompiled"]
calls = after["calls"] - before["calls"]
in_run = {k: (after["split_seconds"][k] - before["split_seconds"][k]) / max(calls, 1) * 1e6
          for k in after["split_seconds"]}

captured = []
route = pc.PrecompiledBlock._route
def spy(self, cache, args, kwargs):
    if not captured:
        kw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()}
        modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        captured.append((self, cache, self._state.flags(), args, kw, modes))
    return route(self, cache, args, kwargs)
pc.PrecompiledBlock._route = spy
sample(3)
pc.PrecompiledBlock._route = route
block, cache, flags, args, kwargs, modes = captured[0]
torch.set_grad_enabled(modes[0])  # the call's grad and inference modes (torch's guards check them)
torch.inference_mode(modes[1]).__enter__()
fingerprint, static = block._keys()
assert block._last is not None, f"the block call is not answered by an artifact: {record.summary()['precompiled']}"
answer = block._last[2]
fn, matched, code = answer.fn, answer.matched, answer.code
module = block._orig_mod
env = block._binder(module, args, kwargs)
block.jit(*args, **kwargs)  # the jit of the same block once (from the cache), for its own guard check
from steadfast.core import torch_compat
jit_tree = torch_compat.cache_entry_guards(type(module).forward.__code__)[0]
jit_locals = dict(env)
checks = {
    "binder (the call's locals)": lambda: block._binder(module, args, kwargs),
    "one tree: the artifact's guards and the pack's checks (code, carried guards, hooks)": (
        lambda: answer.combined.check(env)
    ),
}
reference = {
    "the jit's own guard check": lambda: jit_tree.check(jit_locals),
    "before: pack checks, C++ tree of their own": lambda: answer.checks.check(env),
    "before: artifact's guards, C++ tree of their own": lambda: answer.manager.check(env),
    "hook walk (only on a miss)": lambda: pc.hooks_reason(module),
    "key (only when the last answer misses)": lambda: pc.call_key(fingerprint, static, args, kwargs, flags=flags),
    "before: pack checks, Python": lambda: code.still() and matched.still(env),
    "before: artifact's guard_check (binds the signature)": lambda: fn.guard_check(module, *args, **kwargs),
}
assert answer.checks is not None and answer.manager is not None, "the checks are not guard trees here"
assert answer.combined is not None, "the checks do not run as one tree here"
assert all(f() for k, f in checks.items() if not k.startswith("binder")), "a check fails"
assert reference["hook walk (only on a miss)"]() is None, "a hook is set"
assert all(f() for k, f in reference.items() if not k.startswith(("key", "hook"))), "a check fails"

def quiet(f, n=2000):
    return min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6

def after_kernel(f, n=30):
    times = []
    for _ in range(n):
        fn(module, *args, **kwargs)
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6

rows = {k: {"quiet": quiet(f), "after_kernel": after_kernel(f)} for k, f in checks.items()}
ref = {k: {"quiet": quiet(f), "after_kernel": after_kernel(f)} for k, f in reference.items()}

def route_checks():
    return answer.combined.check(block._binder(module, args, kwargs))

def paired(n=1000, rounds=31):  # the route's checks and the jit's, timed in turn: the machine's drift falls on both
    ratios = []
    for _ in range(rounds):
        a = timeit.timeit(route_checks, number=n)
        b = timeit.timeit(reference["the jit's own guard check"], number=n)
        ratios.append(a / b)
    ratios.sort()
    return {"median": statistics.median(ratios), "q1": ratios[len(ratios) // 4], "q3": ratios[3 * len(ratios) // 4]}

print("RESULT " + json.dumps({"rows": rows, "reference": ref, "in_run": in_run, "block_calls": calls / 10,
                              "paired": paired(),
                              "guards": len(matched.guards), "code_paths": len(code.paths),
                              "leaves": {"artifact": torch_compat.leaf_count(answer.manager),
                                         "pack": answer.checks.leaves, "one tree": answer.combined.leaves,
                                         "jit": torch_compat.leaf_count(jit_tree)},
                              "hits": after["hits"] - before["hits"],
                              "fallbacks": after["fallbacks"] - before["fallbacks"],
                              "depends_on_seed": not torch.equal(out1, out2)}), flush=True)
os._exit(0)  # torch 2.11 may die at exit after compiled code ran (docs/compatibility.md, torch 2.11 exit row)
"""


def child(mode: str, caches: Path, ckpt: Path, steps: int, side: int) -> dict[str, Any]:
    """One fresh process on the compile cache under ``caches``; its RESULT dict."""
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "STEADFAST_COMPILE_CACHE": str(caches / "steadfast"),
    }
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, here, mode, str(ckpt), str(steps), str(side)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{mode} process failed (exit {out.returncode}):\n{out.stderr[-4000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--side", type=int, default=64, help="image side in pixels")
    args = ap.parse_args()
    t_start = time.perf_counter()
    _common.print_header(
        "Precompiled route: per-call checks, quiet and after a block's kernels",
        {"steps": args.steps, "side": args.side},
    )
    ckpt = _common.tiny_sd15_module().cached_tiny_sd15(in_subprocess=True)
    with tempfile.TemporaryDirectory() as tmp:
        populate = child("populate", Path(tmp), ckpt, args.steps, args.side)
        got = child("measure", Path(tmp), ckpt, args.steps, args.side)
    assert populate["depends_on_seed"] and got["depends_on_seed"], "the output does not depend on the seed"
    print(
        f"one {got['block_calls']:.0f}-block-call sampling run; {got['guards']} carried guards and "
        f"{got['code_paths']} traced code paths per answer; {got['hits']} artifact hits, {got['fallbacks']} "
        f"fallbacks in 10 runs; the block's artifact {got['in_run']['artifact']:.0f} us per call in a run"
    )
    leaves = got["leaves"]
    print(
        f"checks (C++ guard leaves): the artifact's tree {leaves['artifact']}, the pack's {leaves['pack']}, the one "
        f"tree {leaves['one tree']}; the jit's own tree {leaves['jit']}\n"
    )

    def table(rows: dict[str, dict[str, float]]) -> list[list[str]]:
        return [
            [k, f"{r['quiet']:.1f}", f"{r['after_kernel']:.1f}", f"{r['after_kernel'] / r['quiet']:.1f}x"]
            for k, r in rows.items()
        ]

    total = [sum(r[k] for r in got["rows"].values()) for k in ("quiet", "after_kernel")]
    jit = got["reference"]["the jit's own guard check"]
    body = [*table(got["rows"]), ["the route's checks per call", f"{total[0]:.1f}", f"{total[1]:.1f}", "-"]]
    body += table(got["reference"])
    body.append(
        ["route / jit guard check", f"{total[0] / jit['quiet']:.2f}x", f"{total[1] / jit['after_kernel']:.2f}x", "-"]
    )
    print(_common.markdown_table(["check", "quiet, us", "after kernel, us", "after / quiet"], body))
    p = got["paired"]
    print(
        f"\nquiet, paired (the route's checks, binder included, and the jit's, 31 rounds of 1,000 calls in turn): "
        f"route / jit median {p['median']:.2f}x (quartiles {p['q1']:.2f}-{p['q3']:.2f})"
    )
    split = ", ".join(f"{k} {v:.1f}" for k, v in got["in_run"].items())
    print(f"\nin a run, the route's split per block call (us): {split}")
    _common.print_footer(t_start)


if __name__ == "__main__":
    main()
