"""``benchmarks/gpu_protocol.py --smoke``: the GPU protocol's script end to end on the CPU, at tiny sizes.

The real run needs a GPU (one device call, benchmarks/gpu_protocol_prepare.sh); this checks that every section
runs in its own process, that the JSON and the markdown table are written with every section present, and that
the correctness cases a CPU can run pass (sampler families in both seed modes, comfy mode == KSampler, batch
invariance under Determinism Setup, LoRA + quantize, the pipeline nodes, CPU vs CPU verdict).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from comfy_server import comfyui_version

pytestmark = [pytest.mark.comfyui, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_protocol  # noqa: E402 - importable only once benchmarks/ is on sys.path (line above)

#: cases that need a GPU, a C++ compiler run or that only report numbers: not asserted to pass on the CPU
INFO_ONLY = {"info", "skipped"}


#: ``--scale`` (every section's smoke budget times this) defaults to 4: CI runs two lanes at once on 2 cores
#: (.ci/run), and a check of the whole CI on a machine loaded far beyond that (load average 6-9) saw compile_flux's
#: smoke killed at 2 x 120 s. The budgets bound a GPU run; here the point is that every section runs.
@pytest.fixture(scope="module")
def protocol(comfyui_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    if comfyui_version(comfyui_path) < (0, 33):
        pytest.skip("the GPU protocol targets ComfyUI 0.33 (Dynamic VRAM, its switches); CI runs it on that row")
    out = tmp_path_factory.mktemp("gpu_protocol_out")
    work = tmp_path_factory.mktemp("gpu_protocol_work")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_protocol.py"),
            "--smoke",
            "--out",
            str(out),
            "--work",
            str(work),
            "--scale",
            os.environ.get("STEADFAST_PROTOCOL_SCALE", "4"),
            "--budget",
            "2400",
        ],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
        env=dict(os.environ, COMFYUI_PATH=str(comfyui_path)),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {
        "json": json.loads((out / "gpu_protocol.json").read_text()),
        "md": (out / "gpu_protocol.md").read_text(),
        "stdout": proc.stdout,
    }


def test_every_section_is_reported(protocol: dict) -> None:
    res = protocol["json"]
    assert res["smoke"] is True
    assert list(res["sections"]) == [name for name, _, _ in gpu_protocol.SECTIONS]
    for name, sec in res["sections"].items():
        assert sec["status"] == "ran", (name, sec.get("status"), sec.get("log_tail", "")[-1500:])
        assert sec["cases"], name
        assert f"| {name} |" in protocol["md"], name
    assert res["sections"]["env"]["metrics"]["cuda_available"] in (True, False)


def test_cpu_runnable_correctness_cases_pass(protocol: dict) -> None:
    bad = [
        (name, c["case"], c["status"], c["detail"][:300])
        for name, sec in protocol["json"]["sections"].items()
        for c in sec["cases"]
        if c["status"] not in ("pass", *INFO_ONLY, "refused")
    ]
    assert bad == []
    nodes = {c["case"]: c for c in protocol["json"]["sections"]["nodes_dynamic_vram_on"]["cases"]}
    for fam in gpu_protocol.SMOKE_FAMILIES:
        case = next(c for k, c in nodes.items() if k.startswith(f"sampler {fam} "))
        assert case["status"] == "pass" and "comfy == KSampler True" in case["detail"]
    det = next(c for k, c in nodes.items() if k.startswith("Determinism Setup"))
    assert "batch invariance (item 0 of 3 == single) True" in det["detail"]
    verdict = protocol["json"]["sections"]["cpu_vs_gpu"]["metrics"]
    assert verdict["latent_bit_equal"] is True  # smoke: both servers are CPU servers
    # the steady timing says, per Steadfast prompt, whether Optimize ran again and how many models ComfyUI built:
    # its one round follows a KSampler prompt, which evicted Optimize's output (both ComfyUI rows' default caches),
    # and a CPU server's Optimize clones without building a model
    default = next(c for c in protocol["json"]["sections"]["memory_modes"]["cases"] if c["case"] == "default")
    assert default["optimize_executed_again"] == 1
    assert default["model_builds"] == {"ksampler": [0], "steadfast": [0]}
    # and the compile state: Optimize ran again, on the module compiled by the first prompt, and traced nothing
    assert [c["graphs"] for c in default["compile_per_prompt"]] == [0], default["compile_per_prompt"]
    assert default["compile_first_prompt"]["graphs"] >= 1  # the first prompt traced: the count counts


def test_a_failing_section_is_recorded_and_the_rest_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A section that dies (here: over its budget) is recorded with its error; the JSON/table are still written."""
    monkeypatch.setattr(gpu_protocol, "SECTIONS", [("env", 30, 60), ("steady_flux", 60, 1)])
    assert gpu_protocol.main(["--smoke", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")]) == 0
    res = json.loads((tmp_path / "o" / "gpu_protocol.json").read_text())
    assert res["sections"]["env"]["status"] == "ran"
    assert res["sections"]["steady_flux"]["status"].startswith("error: over its 1 s budget")
    assert "| steady_flux | - | error: over its 1 s budget" in (tmp_path / "o" / "gpu_protocol.md").read_text()
    # and a budget too small to start anything: every section says so, the files are still written
    assert (
        gpu_protocol.main(["--smoke", "--budget", "5", "--out", str(tmp_path / "p"), "--work", str(tmp_path / "w")])
        == 0
    )
    late = json.loads((tmp_path / "p" / "gpu_protocol.json").read_text())
    assert {s["status"] for s in late["sections"].values()} == {"skipped: out of time"}
    assert "skipped: out of time" in (tmp_path / "p" / "gpu_protocol.md").read_text()
