"""``steadfast run`` over the Comfy API v2: real ComfyUI servers, each behind ``comfy-api-proxy`` (one with a bearer
token), driven with ``comfy-sdk``; the verdict is the pack's tensor hash read from the Hash node's verdict file.

- two servers with the same setting give one verdict, every run a fresh execution (an identical resubmission
  included), equal to the native path's hash;
- a third server with another setting (one CPU thread) gives the explained mismatch, as on the native path;
- an unreachable server, a wrong or missing token, an invalid workflow and a node failing during execution each give
  a clear error, with the server's details kept (node errors, the failing node) and the token never printed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from comfy_server import ComfyServer, comfyui_version
from tiny_sd15 import CHECKPOINT_NAME as TINY_CKPT_NAME
from v2_proxy import PROXY_MISSING, ApiProxy, proxy_installed

pytestmark = [
    pytest.mark.comfyui,
    pytest.mark.skipif(not proxy_installed(), reason=PROXY_MISSING),
]

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "example_workflows" / "api" / "determinism_check.json"
TOKEN_ENV = "STEADFAST_TEST_V2_TOKEN"
TOKEN = "sf-test-token-7c1d9a"  # a test value: the proxy is on 127.0.0.1 and lives for this module only


def steadfast_run(*args: str | Path, token: str | None = None, timeout: float = 900) -> tuple[int, str, dict | None]:
    """``python scripts/steadfast.py run ...`` with the token (if any) in ``$STEADFAST_TEST_V2_TOKEN`` only
    -> (exit code, output, JSON report or None)."""
    report = Path(str(args[0]) + ".v2report.json")
    report.unlink(missing_ok=True)
    cmd = [sys.executable, str(ROOT / "scripts" / "steadfast.py"), "run", *map(str, args), "--json", str(report)]
    cmd += ["--token-env", TOKEN_ENV]
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, "COMFY_API_KEY", "COMFY_BASE_URL")}
    if token is not None:
        env[TOKEN_ENV] = token
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    data = json.loads(report.read_text()) if report.is_file() else None
    return proc.returncode, proc.stdout + proc.stderr, data


@pytest.fixture(scope="module")
def wf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wf = json.loads(WORKFLOW.read_text())
    for node in wf.values():
        if node["class_type"] == "SteadfastSeededSampler":
            node["inputs"]["steps"] = 2
    path = tmp_path_factory.mktemp("wf") / "check.json"
    path.write_text(json.dumps(wf))
    return path


@pytest.fixture(scope="module")
def fleet(comfyui_path: Path, tiny_ckpt: Path) -> Iterator[dict[str, object]]:
    """Three ComfyUI servers, each behind its own proxy: ``a`` (token), ``b`` (no token), ``c`` (one CPU thread)."""
    if comfyui_version(comfyui_path) < (0, 33):
        pytest.skip("the Comfy API v2 tests run on the 0.33.0 row (comfy-api-proxy 0.1.6 is tested against it)")
    ck = {TINY_CKPT_NAME: tiny_ckpt}
    with (
        ComfyServer(ck, comfyui=comfyui_path) as a,
        ComfyServer(ck, comfyui=comfyui_path) as b,
        ComfyServer(ck, comfyui=comfyui_path, env={"OMP_NUM_THREADS": "1"}) as c,
        ApiProxy(a.url, token=TOKEN) as pa,
        ApiProxy(b.url) as pb,
        ApiProxy(c.url) as pc,
    ):
        yield {"a": a, "pa": pa, "pb": pb, "pc": pc}


def _no_token(out: str, report: dict | None) -> None:
    assert TOKEN not in out and TOKEN not in json.dumps(report or {})


def test_two_v2_servers_give_one_verdict_every_run_fresh(wf_file: Path, fleet) -> None:
    pa, pb = fleet["pa"], fleet["pb"]
    code, out, report = steadfast_run(wf_file, "--server", pa.url, "--server", pb.url, "--runs", "2", token=TOKEN)
    assert code == 0 and report["ok"] and "PASS" in out, out
    _no_token(out, report)
    assert f"Comfy API v2 at {pa.url} (token from ${TOKEN_ENV})" in out
    assert [r["server"] for r in report["runs"]] == [f"v2 {pa.url}"] * 2 + [f"v2 {pb.url}"] * 2
    # the second run is an identical resubmission: still fresh, as the proxy itself answered
    assert all("outputs_reused: false" in r["fresh"] for r in report["runs"]), report["runs"]
    assert "every run a fresh execution" in out
    (digests,) = report["distinct"].values()
    assert len(digests) == 1 and len(digests[0]) == 64
    # the verdict is the pack's tensor hash: the native path on server a gives the same digest
    code, out, native = steadfast_run(wf_file, "--server", fleet["a"].url, "--runs", "1")
    assert code == 0 and native["distinct"] == report["distinct"], out
    assert "node caches dropped before the run" in native["runs"][0]["fresh"]


def test_a_third_server_with_another_setting_gives_the_explained_mismatch(wf_file: Path, fleet) -> None:
    code, out, report = steadfast_run(
        wf_file, "--server", fleet["pa"].url, "--server", fleet["pc"].url, "--runs", "1", token=TOKEN
    )
    # other bytes, the same picture (graded from the verdict files' thumbnails): exit 3, as on the native path
    assert code == 3 and not report["ok"] and report["verdict"] == "same_picture", out
    assert "fingerprint.num_threads: 2 -> 1  [changes bits" in out
    assert "SAME PICTURE" in out
    _no_token(out, report)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_and_refused_tokens_are_named(wf_file: Path, fleet) -> None:
    code, out, _ = steadfast_run(wf_file, "--api", "v2", "--server", f"http://127.0.0.1:{_free_port()}")
    assert code == 2 and "cannot reach Comfy API v2 at http://127.0.0.1:" in out, out
    wrong = "sf-wrong-token-55aa"
    code, out, _ = steadfast_run(wf_file, "--server", fleet["pa"].url, token=wrong)
    assert code == 2 and f"refused the token from ${TOKEN_ENV}: HTTP 401" in out, out
    assert wrong not in out
    code, out, _ = steadfast_run(wf_file, "--server", fleet["pa"].url)
    assert code == 2 and f"refused no token (${TOKEN_ENV} is unset): HTTP 401" in out, out
    code, out, _ = steadfast_run(wf_file, "--server", fleet["pa"].url, "--token", TOKEN)
    assert code == 2 and "a token never goes on the command line" in out and TOKEN not in out


def test_an_invalid_workflow_is_refused_with_comfyuis_node_errors(wf_file: Path, fleet, tmp_path: Path) -> None:
    wf = json.loads(wf_file.read_text())
    wf["1"]["inputs"]["ckpt_name"] = "no_such_model.safetensors"  # every output depends on it: ComfyUI answers 400
    bad = tmp_path / "invalid.json"
    bad.write_text(json.dumps(wf))
    code, out, report = steadfast_run(bad, "--server", fleet["pb"].url, "--runs", "1")
    assert code == 1 and report["verdict"] == "failed", out
    (run,) = report["runs"]
    assert "the job was refused: invalid_workflow (HTTP 422)" in run["error"], run
    assert "no_such_model.safetensors" in run["error"] and '"1"' in run["error"]  # ComfyUI's node_errors, kept


def test_a_partly_invalid_workflow_is_a_failed_run_saying_why(wf_file: Path, fleet, tmp_path: Path) -> None:
    """ComfyUI accepts a prompt in which some output still validates (here Determinism Setup's report) and runs only
    those; the proxy forwards that acceptance without ComfyUI's node_errors. The Hash node then lists no verdict file:
    a failed run that says so, never a pass."""
    wf = json.loads(wf_file.read_text())
    wf["6"]["inputs"]["sampler_name"] = "no_such_sampler"
    bad = tmp_path / "partly_invalid.json"
    bad.write_text(json.dumps(wf))
    code, out, report = steadfast_run(bad, "--server", fleet["pb"].url, "--runs", "1")
    assert code == 1 and report["verdict"] == "failed", out
    (run,) = report["runs"]
    assert "Hash node 11 listed no verdict file: either it did not run" in run["error"], run


def test_a_node_failing_during_execution_is_named_with_its_message(wf_file: Path, fleet, tmp_path: Path) -> None:
    code, out, report = steadfast_run(wf_file, "--server", fleet["pb"].url, "--runs", "1")
    assert code == 0, out
    (good,) = next(iter(report["distinct"].values()))
    wrong = good[:-1] + ("0" if good[-1] != "0" else "1")
    wf = json.loads(wf_file.read_text())
    wf["11"]["inputs"].update(expected=wrong, fail_on_mismatch=True)
    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps(wf))
    code, out, report = steadfast_run(failing, "--server", fleet["pa"].url, "--runs", "1", token=TOKEN)
    assert code == 1 and report["verdict"] == "failed", out
    (run,) = report["runs"]
    assert "failed in node 11 (SteadfastHash): node_execution_error" in run["error"], run
    assert wrong in run["error"] and good in run["error"]  # the Hash node's own message: both hashes
    _no_token(out, report)
