"""headless/runner.py without a server: workflow loading (JSON, PNG), checks, comparison, explanation, pin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from steadfast.headless import runner as hl

ROOT = Path(__file__).resolve().parents[2]
WF = json.loads((ROOT / "example_workflows" / "api" / "determinism_check.json").read_text())


def _hash_ids() -> list[str]:
    return [k for k, v in WF.items() if v["class_type"] == hl.HASH_NODE]


def test_loads_api_json_and_png(tmp_path: Path) -> None:
    j = tmp_path / "wf.json"
    j.write_text(json.dumps(WF))
    assert hl.load_workflow(j) == WF
    png = tmp_path / "out.png"
    info = PngInfo()
    info.add_text("prompt", json.dumps(WF))
    info.add_text("workflow", json.dumps({"nodes": [], "links": []}))
    Image.new("RGB", (4, 4)).save(png, pnginfo=info)
    assert hl.load_workflow(png) == WF


@pytest.mark.parametrize(
    "content,match",
    [
        (None, "not found"),
        ("{oops", "not JSON"),
        (json.dumps({"nodes": [], "links": []}), "UI-format"),
        (json.dumps([1, 2]), "not an API-format"),
    ],
)
def test_bad_workflow_files(tmp_path: Path, content, match) -> None:
    f = tmp_path / "wf.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(hl.WorkflowError, match=match):
        hl.load_workflow(f)


def test_png_without_prompt(tmp_path: Path) -> None:
    png = tmp_path / "plain.png"
    Image.new("RGB", (4, 4)).save(png)
    with pytest.raises(hl.WorkflowError, match="no embedded ComfyUI prompt"):
        hl.load_workflow(png)


def test_no_hash_node_and_missing_types() -> None:
    no_hash = {k: v for k, v in WF.items() if v["class_type"] != hl.HASH_NODE}
    with pytest.raises(hl.WorkflowError, match="no SteadfastHash node"):
        hl.hash_nodes(no_hash)
    info = {v["class_type"]: {} for v in WF.values() if v["class_type"] != "SteadfastCompare"}
    assert hl.missing_node_types(WF, info) == ["SteadfastCompare"]


def _result(run: str, h: str, threads: int, match: str = "unchecked") -> hl.RunResult:
    (hid,) = _hash_ids()
    samplers = hl.upstream(WF, hid, hl.SAMPLER_NODES)
    rec = {"seeds": [42], "fingerprint": {"num_threads": threads, "torch": "2.14.1"}}
    return hl.RunResult("srv", run, hashes={hid: h}, checks={hid: match}, records={s: rec for s in samplers})


def test_compare_explains_a_difference_and_passes_equal_runs() -> None:
    same = hl.compare(WF, [_result("1", "a" * 64, 2), _result("2", "a" * 64, 2)])
    assert same.ok and "PASS" in same.as_text()
    diff = hl.compare(WF, [_result("1", "a" * 64, 2), _result("2", "b" * 64, 1)])
    assert not diff.ok
    text = diff.as_text()
    assert "fingerprint.num_threads: 2 -> 1" in text and "FAIL" in text
    failed = hl.compare(WF, [_result("1", "a" * 64, 2, match="mismatch")])
    assert not failed.ok and "does not match its expected hash" in failed.as_text()


def test_pin_fills_expected_and_record() -> None:
    r = _result("1", "c" * 64, 2)
    pinned = hl.pin(WF, r)
    (hid,) = _hash_ids()
    assert pinned[hid]["inputs"]["expected"] == "c" * 64
    assert json.loads(pinned[hid]["inputs"]["expected_record"])["fingerprint"]["num_threads"] == 2
    assert "expected" not in WF[hid]["inputs"] or WF[hid]["inputs"]["expected"] != "c" * 64  # a copy
