"""``steadfast run`` end to end: runs + restart, two servers, a PNG, --pin round trip, every error case, and a
real cross-server difference explained field by field (another thread count)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from comfy_server import ComfyServer
from PIL import Image
from PIL.PngImagePlugin import PngInfo
from tiny_sd15 import CHECKPOINT_NAME as TINY_CKPT_NAME

pytestmark = pytest.mark.comfyui

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "example_workflows" / "api" / "determinism_check.json"


def steadfast_run(*args: str | Path, timeout: float = 900) -> tuple[int, str, dict | None]:
    """``python scripts/steadfast.py run ...`` -> (exit code, output, JSON report or None)."""
    report = Path(str(args[0]) + ".report.json") if args else None
    cmd = [sys.executable, str(ROOT / "scripts" / "steadfast.py"), "run", *map(str, args)]
    if report is not None:
        cmd += ["--json", str(report)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    data = json.loads(report.read_text()) if report is not None and report.is_file() else None
    return proc.returncode, proc.stdout + proc.stderr, data


def _small(wf: dict) -> dict:
    wf = json.loads(json.dumps(wf))
    for node in wf.values():
        if node["class_type"] == "SteadfastSeededSampler":
            node["inputs"]["steps"] = 2
    return wf


@pytest.fixture(scope="module")
def wf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wf") / "check.json"
    path.write_text(json.dumps(_small(json.loads(WORKFLOW.read_text()))))
    return path


@pytest.fixture(scope="module")
def servers(comfyui_path: Path, tiny_ckpt: Path) -> Iterator[tuple[ComfyServer, ComfyServer]]:
    """Two servers with the same model; the second sees one CPU thread (as a smaller machine would)."""
    with (
        ComfyServer({TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path) as a,
        ComfyServer({TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path, env={"OMP_NUM_THREADS": "1"}) as b,
    ):
        yield a, b


def test_runs_and_restart_on_a_started_server(wf_file: Path, tiny_ckpt: Path) -> None:
    code, out, report = steadfast_run(wf_file, "--runs", "2", "--free-between", "--restart")
    assert code == 0, out
    assert report["ok"] and len(report["runs"]) == 3 and "PASS" in out
    (digests,) = report["distinct"].values()
    assert len(digests) == 1 and len(digests[0]) == 64
    assert [r["run"] for r in report["runs"]] == ["run 1", "run 2 after unload", "after restart"]


def test_two_servers_and_an_explained_difference(wf_file: Path, servers) -> None:
    a, b = servers
    code, out, report = steadfast_run(wf_file, "--server", a.url, "--server", a.url, "--runs", "1")
    assert code == 0 and report["ok"], out
    code, out, report = steadfast_run(wf_file, "--server", a.url, "--server", b.url, "--runs", "1")
    # other bytes, the same picture (graded verdict, core/record/verdict.py): exit 3, not 0
    assert code == 3 and not report["ok"] and report["verdict"] == "same_picture", out
    assert "fingerprint.num_threads: 2 -> 1  [changes bits" in out
    assert "SAME PICTURE" in out


def test_png_input_and_pin_round_trip(wf_file: Path, servers, tmp_path: Path) -> None:
    a, _ = servers
    png = tmp_path / "saved.png"
    info = PngInfo()
    info.add_text("prompt", wf_file.read_text())
    Image.new("RGB", (8, 8)).save(png, pnginfo=info)
    pinned = tmp_path / "pinned.json"
    code, out, report = steadfast_run(png, "--server", a.url, "--runs", "1", "--pin", pinned)
    assert code == 0, out
    wf = json.loads(pinned.read_text())
    (hid,) = [k for k, v in wf.items() if v["class_type"] == "SteadfastHash"]
    (digest,) = report["distinct"][hid]
    assert wf[hid]["inputs"]["expected"] == digest
    assert json.loads(wf[hid]["inputs"]["expected_record"])["seeds"]
    code, out, report = steadfast_run(pinned, "--server", a.url, "--runs", "1")
    assert code == 0 and report["runs"][0]["checks"][hid] == "match", out
    wf[hid]["inputs"]["expected"] = ("0" if digest[0] != "0" else "1") + digest[1:]
    bad = tmp_path / "tampered.json"
    bad.write_text(json.dumps(wf))
    # with the pinned thumbnail the picture is graded: equal thumbnails, other bytes -> the same picture (3)
    code, out, _ = steadfast_run(bad, "--server", a.url, "--runs", "1")
    assert code == 3 and "does not match its expected hash" in out
    del wf[hid]["inputs"]["expected_reference"]  # nothing to grade by: a mismatch is a failure (1)
    bad.write_text(json.dumps(wf))
    code, out, _ = steadfast_run(bad, "--server", a.url, "--runs", "1")
    assert code == 1 and "does not match its expected hash" in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_error_cases(wf_file: Path, servers, tmp_path: Path) -> None:
    a, _ = servers
    code, out, _ = steadfast_run(wf_file, "--server", f"http://127.0.0.1:{_free_port()}")
    assert code == 2 and "cannot reach ComfyUI at" in out
    wf = json.loads(wf_file.read_text())
    no_hash = tmp_path / "nohash.json"
    no_hash.write_text(json.dumps({k: v for k, v in wf.items() if v["class_type"] != "SteadfastHash"}))
    code, out, _ = steadfast_run(no_hash, "--server", a.url)
    assert code == 2 and "no SteadfastHash node" in out
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**wf, "99": {"class_type": "NoSuchNodeAnywhere", "inputs": {}}}))
    code, out, _ = steadfast_run(unknown, "--server", a.url)
    assert code == 2 and "does not know node type(s) NoSuchNodeAnywhere" in out
    plain = tmp_path / "plain.png"
    Image.new("RGB", (8, 8)).save(plain)
    code, out, _ = steadfast_run(plain, "--server", a.url)
    assert code == 2 and "no embedded ComfyUI prompt" in out
    code, out, _ = steadfast_run(wf_file, "--server", a.url, "--restart")
    assert code == 2 and "--restart needs a server started by steadfast run" in out
