"""``benchmarks/bench_compile_latency.py``: the model it times and the cache-state bookkeeping it reports.

The benchmark itself runs minutes of inductor compiles, so it is not run here; what its numbers rest on
is: the default Flux is ComfyUI's own class at Flux.1's real depth (19 double + 38 single blocks), the
regional path compiles every one of those blocks, the seeded model's output depends on its input, and
the ISA-probe count that separates "cold" from "primed" recognises inductor's probe sources.
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

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import bench_compile_latency as b
import _common
_common.import_pack()
import torch
from steadfast.core.compile import blocks

dm, call = b.build_model("flux", 32)
paths = blocks.choose_blocks(dm).paths
with torch.inference_mode():
    out = call(dm)
    again = call(dm)
    # the same call with another latent: b.build_model's inputs are fixed, so rebuild them with x changed
    from steadfast.nodes.patches.attention import attention_override

    def with_x(key):
        return dm(b._randn((1, 16, 64, 64), key), torch.tensor([0.5]), b._randn((1, 32, 256), "flux.context"),
                  y=b._randn((1, 256), "flux.y"),
                  transformer_options={"optimized_attention_override": attention_override("auto")})

    rebuilt, other = with_x("flux.x"), with_x("test.other_x")
print("RESULT " + json.dumps({
    "cls": type(dm).__module__ + "." + type(dm).__name__,
    "double": len(dm.double_blocks), "single": len(dm.single_blocks),
    "paths": paths, "shape": list(out.shape), "finite": bool(torch.isfinite(out).all()),
    "std": float(out.std()), "rerun_equal": bool(torch.equal(out, again)),
    "rebuilt_equal": bool(torch.equal(out, rebuilt)), "moved_max": float((other - out).abs().max()),
}))
"""


def test_default_flux_is_real_depth_and_regional_covers_every_block(comfyui_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT / "benchmarks")],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, COMFYUI_PATH=str(comfyui_path)),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert res["cls"] == "comfy.ldm.flux.model.Flux"
    assert (res["double"], res["single"]) == (19, 38)
    assert sorted(res["paths"]) == sorted(
        [f"double_blocks.{i}" for i in range(19)] + [f"single_blocks.{i}" for i in range(38)]
    )
    assert res["shape"] == [1, 16, 64, 64] and res["finite"] and res["std"] > 0.1
    assert res["rerun_equal"] and res["rebuilt_equal"]  # the second input differs from the first in x only
    assert res["moved_max"] > 1e-3  # seeded weights: the output depends on the latent


def test_isa_probe_sources_are_recognised(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_compile_latency as b
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "cabcdefgh123.cpp").write_text('extern "C" void __avx_chk_kernel() {}')
    (tmp_path / "cd").mkdir()
    (tmp_path / "cd" / "ccdefghij456.cpp").write_text('extern "C" __m512bh __avx512_bf16_chk_kernel() {}')
    (tmp_path / "cd" / "ckernel00000.main.cpp").write_text("void cpp_fused_add_0() {}")
    assert b.inductor_probes(tmp_path) == ["__avx_chk_kernel:cabcdefg", "__avx512_bf16_chk_kernel:ccdefghi"]
    assert b.inductor_probes(tmp_path / "cd") == ["__avx512_bf16_chk_kernel:ccdefghi"]
