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


class _Output:
    def __init__(self, name: str, data: bytes) -> None:
        self.name, self._data = name, data

    def to_bytes(self) -> bytes:
        return self._data


class _RacingJob:
    """A job as ``comfy-sdk`` polls it through ``comfy-api-proxy`` 0.1.6 when ComfyUI moves it from running to its
    history between the proxy's two reads: ``expired`` for ``expired_polls`` polls, then what the history holds."""

    def __init__(self, expired_polls: int, doc: bytes) -> None:
        self.status, self.error, self._left, self._doc, self.refreshes = "expired", None, expired_polls, doc, 0

    def wait(self, timeout: float | None = None) -> None:
        return None

    def refresh(self) -> None:
        self.refreshes += 1
        self._left -= 1
        if self._left <= 0:
            self.status = "succeeded"

    def get_outputs(self, node_id: str) -> list[_Output]:
        return [_Output("steadfast_verdict_00001_.json", self._doc)] if self.status == "succeeded" else []


@pytest.mark.skipif(importlib.util.find_spec("comfy_sdk") is None, reason="comfy-sdk not installed")
def test_a_job_answered_expired_by_the_proxys_race_is_polled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from steadfast.core.record import hashing, verdict_file

    monkeypatch.setattr(v2.time, "sleep", lambda s: None)
    img = torch.rand(1, 8, 8, 3, generator=torch.Generator().manual_seed(0))
    res = hashing.hash_inputs(image=img)
    doc = verdict_file.build(
        hashes=res.as_dict(),
        kind="image",
        dtype=str(torch.uint8),
        source_dtype=str(img.dtype),
        shape=res.image_shape,
        match="unchecked",
        expected="",
        explanation="",
        record=None,
        reference=None,
        verdict=None,
    )
    data = verdict_file.dumps(doc).encode()
    prompt = v2.with_nonce(WF)
    server = v2.V2Server("http://127.0.0.1:9")
    try:
        job = _RacingJob(2, data)  # a succeeded job, answered expired twice (the race)
        server._jobs["j1"] = (job, prompt)
        entry = server.wait("j1")
        (item,) = entry["outputs"]["11"]["steadfast_hash"]
        assert item["hash"] == doc["hash"] and job.refreshes == 2
        gone = _RacingJob(v2.EXPIRED_REPOLLS + 5, data)  # really gone: the status counts, and says so
        server._jobs["j2"] = (gone, prompt)
        with pytest.raises(v2.V2RunError, match=r"j2 expired: no error given \(still expired when polled "):
            server.wait("j2")
        assert gone.refreshes == v2.EXPIRED_REPOLLS
    finally:
        server.close()
