"""fp8 weights (ComfyUI ``--fp8_e4m3fn-unet``) with Optimize Model, through a real ComfyUI server on the CPU.

Issue 24 item 2: the SDPA probe ran in the *weight* dtype (fp8), where no backend runs, so Optimize Model with the
default ``attention=auto`` failed with ``UnsupportedBackendError`` although sampling computes in
``manual_cast_dtype``. The probe now uses the compute dtype (``nodes/patches/precision.py::compute_dtype``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comfy_server import ComfyServer
from steadfast_workflows import only, record_of, run, text, workflow
from tiny_sd15 import CHECKPOINT_NAME as TINY_CKPT_NAME  # headless/ is on sys.path (tests/comfy/conftest.py)

pytestmark = [pytest.mark.comfyui, pytest.mark.slow]


@pytest.fixture(scope="module")
def fp8_server(comfyui_path: Path, tiny_ckpt: Path) -> Iterator[ComfyServer]:
    with ComfyServer({TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path, extra_args=["--fp8_e4m3fn-unet"]) as srv:
        yield srv


def _workflow(attention: str) -> dict[str, Any]:
    """Checkpoint -> Seeded Sampler (node 6) and Checkpoint -> Optimize Model (13: compile off, no fusion,
    ``attention``) -> Seeded Sampler (7), both into Compare (14), the output node that makes them run."""
    wf = workflow("optimized_vs_baseline", steps=2)
    wf["6"]["inputs"]["model"] = ["1", 0]
    wf["13"]["inputs"].update({"model": ["1", 0], "compile": "off", "qkv_fusion": False, "attention": attention})
    return only(wf, "14")


def test_fp8_unet_optimize_attention_auto_runs(fp8_server: ComfyServer) -> None:
    base = None
    for attention in ("auto", "math"):
        entry = run(fp8_server, _workflow(attention))
        base = base or record_of(entry, "6")  # the plain sampler is answered from cache the second time
        rec = record_of(entry, "7")
        assert base["fingerprint"]["dtype"].startswith("torch.float8_e4m3fn (compute "), base["fingerprint"]["dtype"]
        report = text(entry, "13")
        compute = rec["fingerprint"]["dtype"].split("(compute ")[1].rstrip(")")
        assert f"backend {attention} on cpu ({compute})" in report, report
        assert "float8" not in compute
        assert rec["fingerprint"]["attention"] == f"pytorch_sdpa:{attention}"
        assert rec["output_shape"] == base["output_shape"]
        assert "attention_fallbacks" not in rec.get("details", {})  # CPU kernels take every probed case
