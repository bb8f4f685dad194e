"""Tests for headless/verify.py + headless/verify_cli.py: configuration parsing, the report, the grid, exit codes, and
one subprocess run of the CLI whose digest must equal an in-process generation (cross-process determinism).

No inductor here (``--compile-backend eager`` where compile appears); 1 intra-op thread throughout, also
in the subprocess (``--threads 1``), because fp32 CPU output depends on the thread count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pipeline_fixtures as tp
import pytest

from steadfast.core.determinism.policy import DeterminismPolicy
from steadfast.core.pipelines import generate
from steadfast.core.record.hashing import hash_image
from steadfast.headless.verify import SCHEMA, VerifySettings, config_names, parse_configs, run_verify
from steadfast.headless.verify_cli import main

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/fixtures/torch_fixtures.py


def test_parse_configs_expectations_and_errors():
    cfgs = parse_configs(
        "qkv,channels_last,qkv,attn-flash,compile-regional,qkv+channels_last", compile_backend="eager"
    )
    names = [c.name for c in cfgs]
    assert names == ["baseline", "qkv", "channels_last", "attn-flash", "compile-regional", "qkv+channels_last"]
    exp = {c.name: c.expectation for c in cfgs}
    assert exp == {
        "baseline": "reference",
        "qkv": "bit-equal",
        "channels_last": "differs",
        "attn-flash": "bit-equal",
        "compile-regional": "bit-equal",
        "qkv+channels_last": "differs",
    }
    combo = cfgs[-1].options
    assert combo.qkv_fusion and combo.channels_last and combo.scope == "off"
    inductor = parse_configs("compile-full", compile_backend="inductor")[1]
    assert inductor.expectation == "differs" and "not bit-equal" in inductor.reason
    assert parse_configs("qkv", dtype="bf16")[1].expectation == "may differ"
    assert parse_configs("vae-slicing", batch=2)[1].expectation == "may differ"
    with pytest.raises(ValueError, match="unknown configuration 'warp-speed'"):
        parse_configs("baseline,warp-speed")
    with pytest.raises(ValueError, match="no configurations"):
        parse_configs(" , ")
    assert "attn-math" in config_names() and "attn-_native_math" in config_names()


def test_run_verify_report_grid_and_parity(tmp_path):
    settings = VerifySettings(
        tiny="sd",
        configs="baseline,qkv,channels_last,attn-flash,vae-tiling,compile-regional",
        runs=2,
        rounds=1,
        steps=2,
        compile_backend="eager",
        out_dir=tmp_path / "out",
        progress=False,
    )
    result = run_verify(settings)
    assert result.exit_code == 0 and result.ok
    report = json.loads(result.report_path.read_text())
    assert report["schema"] == SCHEMA and report["ok"] is True and report["exit_code"] == 0
    assert {
        "source",
        "settings",
        "self_consistency",
        "configs",
        "environment",
        "environment_digest",
        "grid",
        "report",
        "seconds",
    } <= set(report)
    assert report["source"]["pipeline"] == "StableDiffusionPipeline"
    by = {e["name"]: e for e in report["configs"]}
    assert list(by) == ["baseline", "qkv", "channels_last", "attn-flash", "vae-tiling", "compile-regional"]
    for e in by.values():
        assert e["error"] is None and e["self_consistent"] is True
        assert len(set(e["digests"]["raw_float32"])) == 1 and len(e["digests"]["raw_float32"]) == 2
        t = e["timing"]
        # one timed round: the median is that sample (seconds), and it fits inside the whole run's seconds
        assert len(t["samples_s"]) == 1 and t["median_s"] == pytest.approx(t["samples_s"][0], abs=1e-6)
        assert 0 < t["median_s"] < report["seconds"]
    assert by["baseline"]["timing"]["ratio_vs_baseline"] == pytest.approx(1.0)
    # parity is measured; the statuses compare it with the stated expectation
    assert by["qkv"]["parity"]["identical"] is True and by["qkv"]["status"] == "as expected"
    assert by["channels_last"]["parity"]["identical"] is False and by["channels_last"]["parity"]["max_abs"] > 0
    assert by["vae-tiling"]["expectation"] == "differs" and "tile" in by["vae-tiling"]["reason"]
    assert by["vae-tiling"]["status"] == "as expected"
    comp = by["compile-regional"]
    assert comp["compile"]["status"] == "warm" and comp["compile"]["blocks"] == 8
    print("compile-regional (eager backend) vs baseline:", comp["parity"]["identical"], comp["parity"]["max_abs"])
    for e in by.values():
        if e["status"] != "measured" and e["name"] != "baseline":
            assert e["status"] in ("as expected", "unexpectedly bit-equal"), (e["name"], e["status"])
    table = result.table()
    assert "channels_last" in table and "max|d|" in table and "SELF-CONSISTENT" in table

    from PIL import Image

    with Image.open(result.grid_path) as im:
        im.verify()
    with Image.open(result.grid_path) as im:
        assert im.format == "PNG" and im.width >= 6 * 160 and im.height > 2 * 160
        # first column: the baseline image (nearest-upscaled tile), not a blank canvas
        tile = im.crop((6, 6 + 54, 6 + 160, 6 + 54 + 160)).convert("L")
        assert len(set(tile.getdata())) > 20


def test_cli_subprocess_matches_in_process_generation(tmp_path):
    out = tmp_path / "cli"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "steadfast.py"),
            "verify",
            "--tiny",
            "sd",
            "--configs",
            "baseline",
            "--runs",
            "2",
            "--rounds",
            "0",
            "--steps",
            "2",
            "--seed",
            "7",
            "--threads",
            "1",
            "--deterministic",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SELF-CONSISTENT" in proc.stdout and "baseline" in proc.stdout
    report = json.loads((out / "verify_report.json").read_text())
    assert (out / "verify_grid.png").is_file()
    cli_digest = report["configs"][0]["digests"]["raw_float32"][0]
    assert report["settings"]["policy"]["strict"] is True
    # same tiny pipeline (seeded builder), same settings and policy, this process
    pipe = tp.fresh(tp.tiny_dir(tmp_path, "sd"))
    img = generate(
        pipe, report["settings"]["prompt"], steps=2, width=64, height=64, seed=7, policy=DeterminismPolicy(strict=True)
    )
    assert hash_image(img, raw=True) == cli_digest


def test_exit_code_1_when_not_self_consistent(tmp_path, monkeypatch):
    import steadfast.headless.verify as verify_mod

    real = verify_mod.generate
    calls = {"n": 0}

    def drifting(*args, **kwargs):  # a pipeline whose output changes from run to run
        calls["n"] += 1
        img = real(*args, **kwargs)
        return (img + calls["n"] * 1e-3).clamp(0, 1)

    monkeypatch.setattr(verify_mod, "generate", drifting)
    code = main(
        [
            "verify",
            "--tiny",
            "sd",
            "--configs",
            "baseline",
            "--runs",
            "2",
            "--rounds",
            "0",
            "--steps",
            "1",
            "--no-progress",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert code == 1
    report = json.loads((tmp_path / "o" / "verify_report.json").read_text())
    assert report["ok"] is False and report["configs"][0]["self_consistent"] is False


def test_cli_errors_and_listing(tmp_path, capsys):
    assert main(["verify", str(tmp_path / "missing"), "--no-progress", "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["verify", "--tiny", "sd", "--configs", "bogus", "--no-progress"]) == 2
    assert "unknown configuration" in capsys.readouterr().err
    assert main(["verify", "--list-configs"]) == 0
    assert "compile-regional" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["verify", "--tiny", "sd", "--size", "3"])
    with pytest.raises(SystemExit):
        main(["verify", str(tmp_path), "--tiny", "sd"])
    with pytest.raises(ValueError, match="runs must be >= 2"):
        run_verify(VerifySettings(tiny="sd", runs=1))


def test_cli_on_a_saved_flux_pipeline_folder(tmp_path):
    """The command loads a save_pretrained folder (here the tiny Flux pipeline) by path."""
    folder = tp.tiny_dir(tmp_path, "flux")
    assert (folder / "model_index.json").is_file()
    out = tmp_path / "cli_flux"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "steadfast.py"),
            "verify",
            str(folder),
            "--configs",
            "baseline,qkv",
            "--runs",
            "2",
            "--rounds",
            "0",
            "--steps",
            "2",
            "--seed",
            "3",
            "--threads",
            "1",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "verify_report.json").read_text())
    assert report["source"]["pipeline"] == "FluxPipeline"
    by = {e["name"]: e for e in report["configs"]}
    for e in by.values():  # self-consistency: both runs of each configuration gave one digest
        assert e["self_consistent"] is True and len(set(e["digests"]["raw_float32"])) == 1
    print("flux qkv vs baseline:", by["qkv"]["parity"])
