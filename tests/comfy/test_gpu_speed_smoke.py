"""``benchmarks/gpu_speed.py --smoke`` (the GPU speed call of issue 35, with ``sdxl_model.py``'s SDXL UNet) end to
end on the CPU at tiny sizes.

The real run needs a GPU (one device call: docs/benchmarks.md, "GPU speed call (issue 35)"); this checks that every
row of every smoke model comes back with real numbers, written to the JSON and the table, from a cold process and a
warm second process, and that the random-weight models' outputs depend on their inputs. One smoke run (two child
processes) serves every test here; the other tests run no model.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from comfy_server import comfyui_version

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_gpu_sdxl  # noqa: E402 - importable only once benchmarks/ is on sys.path (line above)
import gpu_speed  # noqa: E402


@pytest.fixture(scope="module")
def speed(comfyui_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    if comfyui_version(comfyui_path) < (0, 33):
        pytest.skip(
            "the GPU speed call runs on ComfyUI 0.33 (what gpu_protocol_prepare.sh carries); CI runs its "
            "smoke on that row only (about 40 s of CPU)"
        )
    out = tmp_path_factory.mktemp("gpu_speed_out")
    work = tmp_path_factory.mktemp("gpu_speed_work")
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_speed.py"),
            "--smoke",
            "--out",
            str(out),
            "--work",
            str(work),
            "--rows",
            ",".join(gpu_speed.ROWS),  # steadfast+ro too: its skip under the eager backend
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=dict(os.environ, COMFYUI_PATH=str(comfyui_path)),
    )
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"gpu_speed.py --smoke: {seconds:.1f} s")
    return {
        "json": json.loads((out / "gpu_speed.json").read_text()),
        "md": (out / "gpu_speed.md").read_text(),
        "stdout": proc.stdout,
        "stderr": proc.stderr,
    }


@pytest.mark.comfyui
@pytest.mark.slow
def test_every_row_comes_back_with_real_numbers(speed: dict) -> None:
    res = speed["json"]
    assert res["smoke"] is True
    assert list(res["models"]) == list(gpu_speed.SMOKE_MODELS)
    assert [c["status"] for c in res["children"]] == ["ok", "ok"], res["children"]
    env = res["env"]
    assert env["device_name"].startswith("cpu") and env["torch"] and env["comfyui"] != "unknown"
    assert len(env["bf16_matmul_tflops"]) == 2 and all(r > 0 for r in env["bf16_matmul_tflops"])
    for model, entry in res["models"].items():
        meta = entry["meta"]
        assert meta["steps"] == gpu_speed.SMOKE_STEPS and meta["flops_per_image"] > 0 and meta["parameters"] > 0
        assert list(entry["rows"]) and set(entry["rows"]) == set(gpu_speed.ROWS), model
        for row in gpu_speed.ROWS:
            r = entry["rows"][row]
            if (model, row) in gpu_speed.SMOKE_SKIPS:
                assert r["status"].startswith("skipped: smoke"), (model, row, r)
                continue
            if row in gpu_speed.INDUCTOR_ROWS:  # the smoke's backend is eager
                assert r["status"] == gpu_speed.INDUCTOR_ROWS[row], (model, row, r)
                continue
            assert r["status"] == "ok", (model, row, r)
            assert len(r["times_s"]) == 3 and min(r["times_s"]) > 0, (model, row)
            assert r["s_per_image"] == pytest.approx(statistics.median(r["times_s"]) / meta["batch"])
            assert r["first_image_s"] > 0 and r["finite"] is True, (model, row)
            assert r["run_to_run_equal"] is True, (model, row)  # the same seed three times: the same bits
            assert math.isfinite(r["max_abs_diff_vs_eager"]) and r["max_abs_diff_vs_eager"] >= 0, (model, row)
            assert r["tflops"] > 0 and r["pct_of_matmul"] > 0 and r["speedup_vs_eager"] > 0, (model, row)
            assert r["peak_memory_gib"] > 0 and r["recompiles"] >= 0, (model, row)
            assert r["dynamo_graphs_timed"] >= 0 and r["dynamo_graphs_first"] >= (row != "eager"), (model, row)
            assert f"| {model} | {row} | {r['s_per_image']:.3f} (n=3) |" in speed["md"], (model, row)
        eager, warm = entry["rows"]["eager"], entry["rows"]["warm"]
        assert eager["max_abs_diff_vs_eager"] == 0 and eager["bit_equal_to_eager"] is True
        assert eager["dynamo_graphs_first"] == 0  # eager compiles nothing
        # the second process (its own model build, the same seeds) gives the cold process's bits
        assert warm["bit_equal_to_steadfast"] is True, model
        assert warm["compile"]["status"] == "warm" and warm["compile"]["blocks"] > 0
        assert f"| {model} | warm |" in speed["md"] and "= the steadfast row's bits: True" in speed["md"]
    table = [line for line in speed["md"].splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(res["models"]) * len(gpu_speed.ROWS)  # header, rule, every row
    assert all(line.count("|") == len(gpu_speed.HEADERS) + 1 for line in table)  # no cell splits a column


@pytest.mark.comfyui
@pytest.mark.slow
def test_random_weight_models_depend_on_their_input(speed: dict) -> None:
    for model, entry in speed["json"]["models"].items():
        sens = entry["meta"]["input_sensitivity"]
        assert sens["finite"] is True, model
        assert sens["max_abs_diff"] > 0 and sens["relative"] > 1e-2, (model, sens)  # no zero-initialised output


@pytest.mark.comfyui
@pytest.mark.slow
def test_determinism_row_recompiles_for_its_flags_and_says_so(speed: dict) -> None:
    det = speed["json"]["models"]["flux"]["rows"]["steadfast+det"]
    assert det["recompiles"] >= 1 and len(det["recompile_reasons"]) == det["recompiles"]
    assert all(
        r.startswith("global flag changed since compile:") and "deterministic_algorithms" in r
        for r in det["recompile_reasons"]
    ), det["recompile_reasons"]


def test_sdxl_script_is_the_speed_call_on_sdxl() -> None:
    assert bench_gpu_sdxl.parse_args(["--smoke", "--out", "x"]) == [
        "--models",
        "sdxl-b1,sdxl-b4",
        "--smoke",
        "--out",
        "x",
    ]
    ns = gpu_speed.parse_args(bench_gpu_sdxl.parse_args(["--batch", "4", "--out", "x"]))
    assert ns.models == ["sdxl-b4"] and ns.rows == list(gpu_speed.DEFAULT_ROWS) and ns.budget == 540.0
    assert "steadfast+ro" in gpu_speed.ROWS and "steadfast+ro" not in ns.rows  # asked for by name only
    with pytest.raises(SystemExit):
        bench_gpu_sdxl.parse_args(["--batch", "2", "--out", "x"])
    with pytest.raises(SystemExit):
        gpu_speed.parse_args(["--out", "x", "--images", "2"])  # a median needs at least 3
    assert gpu_speed.plan(["flux", "sdxl-b4"], list(gpu_speed.DEFAULT_ROWS), group=False) == [
        ("cold", ["flux"], ["eager", "steadfast", "steadfast+det", "core"]),
        ("warm", ["flux"], ["warm"]),
        ("cold", ["sdxl-b4"], ["eager", "steadfast", "steadfast+det", "core"]),
        ("warm", ["sdxl-b4"], ["warm"]),
    ]


def test_core_rows_count_dynamo_graphs_as_recompiles() -> None:
    """core has no Steadfast record: its recompiles are the graphs Dynamo compiled in the timed calls (the smoke skips
    core; the protocol's smoke traces it). A Steadfast row counts its own recompiles, not the record's earlier ones."""
    bench = gpu_speed.Bench("sdxl-b4", None, 4, 64, 64, 1, "fp16", lambda m, s: None, dict)
    meta = {"flops_per_image": 2e12}
    eager = {"s_per_image": 1.0}
    core = gpu_speed._finish_row(
        "core",
        {"s_per_image": 2.0, "dynamo_graphs_first": 7, "dynamo_graphs_timed": 1},
        bench,
        meta,
        torch.ones(2),
        torch.zeros(2),
        eager,
        1e12,
        0,
    )
    assert core["s_per_call"] == 2.0 and core["s_per_image"] == 0.5 and core["speedup_vs_eager"] == 2.0
    assert core["tflops"] == pytest.approx(4.0) and core["pct_of_matmul"] == pytest.approx(400.0)
    assert core["recompiles"] == 1 and core["max_abs_diff_vs_eager"] == 1.0 and core["bit_equal_to_eager"] is False
    sf = gpu_speed._finish_row(
        "steadfast+det",
        {"s_per_image": 4.0, "compile": {"recompiles": 3, "recompile_reasons": ["a", "b", "c"]}},
        bench,
        meta,
        torch.ones(2),
        torch.ones(2),
        eager,
        1e12,
        1,
    )
    assert sf["recompiles"] == 2 and sf["recompile_reasons"] == ["b", "c"] and sf["bit_equal_to_eager"] is True
    nan = gpu_speed._finish_row(
        "eager", {"s_per_image": 1.0}, bench, meta, torch.tensor([float("nan")]), torch.zeros(1), None, 1e12, 0
    )
    assert nan["max_abs_diff_vs_eager"] == float("inf")  # a NaN output is never "equal"


def test_a_budget_too_small_records_every_row_and_writes_the_files(tmp_path: Path) -> None:
    """No process starts with less than MIN_START_S left: every row says why, and the JSON and table exist."""
    assert (
        gpu_speed.main(["--smoke", "--budget", "1", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")]) == 0
    )
    res = json.loads((tmp_path / "o" / "gpu_speed.json").read_text())
    assert [c["status"] for c in res["children"]] == ["skipped: out of time"] * 2
    for model in gpu_speed.SMOKE_MODELS:
        assert {r["status"] for r in res["models"][model]["rows"].values()} == {"not run: skipped: out of time"}
    md = (tmp_path / "o" / "gpu_speed.md").read_text()
    assert "| flux | warm |" in md and "not run: skipped: out of time" in md
    assert all(line.count("|") == len(gpu_speed.HEADERS) + 1 for line in md.splitlines() if line.startswith("|"))
