"""headless/v2.py and the runner's freshness rule without a server: the nonce that makes every v2 submission a fresh
execution, the token read from the environment and scrubbed from messages, and a native run that reused a cached
node counted as failed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from steadfast.headless import cli, runner, v2

ROOT = Path(__file__).resolve().parents[2]
WF = json.loads((ROOT / "example_workflows" / "api" / "determinism_check.json").read_text())


def test_every_node_gets_a_new_nonce_and_hash_nodes_write_their_file() -> None:
    a, b = v2.with_nonce(WF), v2.with_nonce(WF)
    assert WF == json.loads((ROOT / "example_workflows" / "api" / "determinism_check.json").read_text())  # unchanged
    for nid, node in a.items():
        assert node["inputs"][v2.NONCE_INPUT] != b[nid]["inputs"][v2.NONCE_INPUT]
        assert len({n["inputs"][v2.NONCE_INPUT] for n in a.values()}) == 1  # one value per submission
        assert {k: v for k, v in node["inputs"].items() if k != v2.NONCE_INPUT} == {
            **WF[nid]["inputs"],
            **({"verdict_file": True} if node["class_type"] == runner.HASH_NODE else {}),
        }
    assert [n for n, v in a.items() if v["inputs"].get("verdict_file") is True] == runner.hash_nodes(WF)
    off = {k: {**v, "inputs": {**v["inputs"], "verdict_file": False}} for k, v in WF.items()}
    assert all(v2.with_nonce(off)[n]["inputs"]["verdict_file"] is True for n in runner.hash_nodes(WF))


def test_token_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SF_T", "  abc \n")
    assert v2.token_from_env("SF_T") == "abc"
    monkeypatch.setenv("SF_T", "   ")
    assert v2.token_from_env("SF_T") is None
    monkeypatch.delenv("SF_T")
    assert v2.token_from_env("SF_T") is None


@pytest.mark.skipif(importlib.util.find_spec("comfy_sdk") is None, reason="comfy-sdk not installed")
def test_messages_never_carry_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMFY_BASE_URL", "http://keep.example")
    server = v2.V2Server("http://127.0.0.1:9", token="s3cr3t-token", token_env="SF_T")
    try:
        assert server.scrub("Bearer s3cr3t-token refused") == "Bearer *** refused"
        assert "s3cr3t-token" not in server.label + repr(server._client)
    finally:
        server.close()
    import os

    assert os.environ["COMFY_BASE_URL"] == "http://keep.example"  # the SDK's variable is restored


def test_the_token_is_refused_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run_main([str(ROOT / "example_workflows" / "api" / "determinism_check.json"), "--token", "x1y2"]) == 2
    err = capsys.readouterr().err
    assert "a token never goes on the command line" in err and "x1y2" not in err


def _entry(cached: list[str]) -> dict:
    return {
        "outputs": {"11": {"steadfast_hash": [{"hash": "a" * 64, "match": "unchecked"}]}},
        "status": {"messages": [["execution_start", {}], ["execution_cached", {"nodes": cached}]]},
    }


def test_a_native_run_with_a_cached_node_is_a_failed_run() -> None:
    fresh = runner.collect("s", "run 1", _entry([]))
    assert fresh.error is None and "served no node from its cache" in fresh.fresh
    stale = runner.collect("s", "run 2", _entry(["6", "11"]))
    assert stale.error and "node(s) 6, 11 came from ComfyUI's cache" in stale.error
    report = runner.compare(WF, [fresh, stale])
    assert report.level == "failed" and report.exit_code == 1
    assert "s: every run a fresh execution" in report.as_text()
    given = runner.collect("v", "run 1", {**_entry(["6"]), "fresh": "fresh execution (nonce)"})
    assert given.error is None and given.fresh == "fresh execution (nonce)"  # the server said how
