"""Which CPU ops change bits under which CPU setting, in default and in portable mode:
``python scripts/measure_portable.py [--variants NAME,...]``.

Each variant is a fresh process (torch, oneDNN and MKL read their variables at start-up) that runs a fixed set
of fp32 ops on seeded inputs (linear, bmm, conv2d, group_norm, layer_norm, softmax, SDPA, gelu, silu, exp,
sum, randn) and saves the outputs; the parent compares every variant with its mode's reference variant and
prints one Markdown row per variant: the ops whose bytes differ, with max |delta|. ``docs/reproducing.md``
quotes the output. On an AVX2-only CPU the AVX512 caps are no-ops (the CPU cannot go higher); the script says
which ISA flags the CPU has.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (mode, env overrides). Portable variants start from core.determinism.portable.portable_env().
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "default": ("default", {}),
    "default aten=default": ("default", {"ATEN_CPU_CAPABILITY": "default"}),
    "default onednn=SSE41": ("default", {"ONEDNN_MAX_CPU_ISA": "SSE41"}),
    "default mkl_instr=SSE4_2": ("default", {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}),
    "default mkl_cbwr=COMPATIBLE": ("default", {"MKL_CBWR": "COMPATIBLE"}),
    "default threads=1": ("default", {"OMP_NUM_THREADS": "1"}),
    "portable": ("portable", {}),
    "portable onednn=SSE41": ("portable", {"ONEDNN_MAX_CPU_ISA": "SSE41", "DNNL_MAX_CPU_ISA": "SSE41"}),
    "portable onednn=AVX512_CORE_AMX": (
        "portable",
        {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX", "DNNL_MAX_CPU_ISA": "AVX512_CORE_AMX"},
    ),
    "portable mkl_instr=SSE4_2": ("portable", {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}),
    "portable mkl_instr=AVX512": ("portable", {"MKL_ENABLE_INSTRUCTIONS": "AVX512"}),
    "portable aten=default (a CPU without AVX2: refused)": ("portable-raw", {"ATEN_CPU_CAPABILITY": "default"}),
}


def child(out: str) -> None:
    """Run the ops in this process and save them (``torch.save``) to ``out``."""
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.nn.functional as F

    mode = os.environ.get("MEASURE_MODE", "default")
    if mode == "portable":
        from core.determinism.portable import apply_in_process

        apply_in_process()
    elif mode == "portable-raw":  # the in-process part without the environment check
        torch.backends.mkldnn.enabled = False
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    import numpy as np

    g = np.random.default_rng(0)  # inputs from numpy: torch.randn itself differs by ATen capability

    def r(*shape: int) -> torch.Tensor:
        return torch.from_numpy(g.standard_normal(shape, dtype=np.float32))

    x, w = r(4096, 320), r(320, 320) / 18
    q, k, v = r(1, 8, 1024, 40), r(1, 8, 77, 40), r(1, 8, 77, 40)
    img, cw = r(1, 64, 32, 32), r(64, 64, 3, 3) / 24
    outs = {
        "linear": F.linear(x, w),
        "bmm": torch.bmm(r(8, 256, 64), r(8, 64, 256)),
        "conv2d": F.conv2d(img, cw, padding=1),
        "group_norm": F.group_norm(img, 32),
        "layer_norm": F.layer_norm(x, (320,)),
        "softmax": torch.softmax(r(8, 1024, 77) * 4, -1),
        "sdpa": F.scaled_dot_product_attention(q, k, v),
        "gelu": F.gelu(x),
        "silu": F.silu(x),
        "exp": torch.exp(x),
        "sum": r(1 << 20).sum().reshape(1),
        "randn": torch.randn(16384, generator=torch.Generator().manual_seed(42)),
    }
    from core.determinism.portable import cpu_settings

    torch.save({"outs": outs, "settings": cpu_settings()}, out)


def run_variant(name: str, tmp: Path) -> dict:
    """Run one variant in a fresh process; returns what :func:`child` saved."""
    import torch

    sys.path.insert(0, str(ROOT))
    from core.determinism.portable import portable_env

    mode, over = VARIANTS[name]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ATEN_", "ONEDNN_", "DNNL_", "MKL_", "OMP_", "STEADFAST_PORTABLE"))
    }
    env.update(portable_env() if mode.startswith("portable") else {})
    env.update(over, MEASURE_MODE=mode)
    out = tmp / (str(abs(hash(name))) + ".pt")
    subprocess.run([sys.executable, __file__, "--child", str(out)], env=env, check=True)
    return torch.load(out)


def main(argv: list[str] | None = None) -> int:
    """Run the variants and print the table (Markdown)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated variant names")
    p.add_argument("--json", type=Path, help="also write the rows as JSON")
    a = p.parse_args(argv)
    if a.child:
        child(a.child)
        return 0
    names = [n for n in a.variants.split(",") if n]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        results = {n: run_variant(n, Path(d)) for n in names}
    refs = {"default": results.get("default"), "portable": results.get("portable")}
    refs["portable-raw"] = refs["portable"]
    print("| variant | reference | settings in use | ops that differ (max abs delta) |\n|---|---|---|---|")
    for n in names:
        mode = VARIANTS[n][0]
        ref_name = "portable" if mode.startswith("portable") else "default"
        ref, cur = refs[ref_name], results[n]
        if ref is None or n == ref_name:
            diffs = "(reference)"
        else:
            bad = []
            for op, t in cur["outs"].items():
                t0 = ref["outs"][op]
                if not torch_equal_bits(t, t0):
                    bad.append(f"{op} {float((t - t0).abs().max()):.2g}")
            diffs = ", ".join(bad) or "none (all bit-equal)"
        s = cur["settings"]
        used = (
            f"aten {s['aten_capability']}, oneDNN {'on' if s['mkldnn_enabled'] else 'off'}, "
            f"MKL {s['mkl_cbwr']}, {s['threads']} thr"
        )
        rows.append({"variant": n, "reference": ref_name, "settings": s, "differ": diffs})
        print(f"| {n} | {ref_name} | {used} | {diffs} |")
    flags = results[names[0]]["settings"]["cpu_flags"]
    print(f"\nCPU flags seen: {', '.join(flags)}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0


def torch_equal_bits(a, b) -> bool:
    """Bit equality of two float tensors (``-0.0`` differs from ``0.0``; equal NaN patterns match)."""
    import torch

    return a.shape == b.shape and bool(torch.equal(a.view(torch.int32), b.view(torch.int32)))


if __name__ == "__main__":
    sys.exit(main())
