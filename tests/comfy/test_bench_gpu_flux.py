"""``benchmarks/bench_gpu_flux.py --smoke``: the GPU Flux benchmark's code path on a tiny Flux on CPU.

The real run needs a GPU (Flux-dev size, bf16); this checks the script end to end (ComfyUI's Flux in a
ModelPatcher, the pack's Determinism Setup and Optimize nodes, sampling, hashing, FLOP counting) with
the ``eager`` compile backend so no C++ compiler run is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.comfyui

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_mode_runs_and_reports(comfyui_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "flux_smoke.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_gpu_flux.py"),
            "--smoke",
            "--backend",
            "eager",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, COMFYUI_PATH=str(comfyui_path)),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["smoke"] is True and res["device"] == "cpu" and res["steps"] == 2
    assert res["flops_per_image"] > 0 and res["bf16_matmul_flops"] > 0
    configs = res["configs"]
    assert list(configs) == ["eager", "steadfast", "steadfast+det"]
    for name, r in configs.items():
        assert r["finite"] and r["s_per_image"] > 0 and len(r["hashes"]) == 2, name
        assert r["run_to_run_equal"] is True, name  # the same seed twice: the same bits
        assert r["pct_of_matmul_peak"] > 0 and r["speedup_vs_eager"] > 0, name
    assert configs["eager"]["bit_equal_to_eager"] is True
    # the compiled model made through the node is tracked; determinism recompiles, and says why
    assert configs["steadfast"]["compile"]["status"] == "warm" and configs["steadfast"]["compile"]["blocks"] == 3
    det = configs["steadfast+det"]["compile"]
    assert det["recompile_reasons"] and all(
        r.startswith("global flag changed since compile:") and "deterministic_algorithms False -> True" in r
        for r in det["recompile_reasons"]
    )
    assert "| steadfast+det |" in proc.stdout
