"""Hash checks and bad inputs through the HTTP API: each failure must be loud and say what to fix.

Validation errors come back as ``PromptRejected`` (HTTP 400, ``node_errors``), execution errors as
``PromptFailed`` (``status_str: "error"`` in ``/history``, with the node and exception message).
A compile failure is the exception: it must NOT fail the prompt, it falls back to eager visibly.
"""
from __future__ import annotations

from typing import Any

import pytest

from comfy_server import ComfyServer, PromptFailed, PromptRejected
from steadfast_workflows import (
    check_ui_lists, compare_of, compile_records, hash_of, only, record_of, run, text, ui, workflow,
)

pytestmark = pytest.mark.comfyui

STEPS = 3


@pytest.fixture(scope="module")
def reference(comfy_server: ComfyServer) -> str:
    """The hash the Hash node (id 11) of determinism_check reports (taken from a run, never hard-coded)."""
    return hash_of(run(comfy_server, workflow("determinism_check", steps=STEPS)), "11")


def _flip(h: str) -> str:
    return h[:-1] + ("0" if h[-1] != "0" else "1")


def test_hash_mismatch_fails_the_prompt_naming_both_hashes(comfy_server: ComfyServer,
                                                           reference: str) -> None:
    wf, good = workflow("determinism_check", steps=STEPS), reference
    wrong = _flip(good)
    wf["11"]["inputs"].update(expected=wrong, fail_on_mismatch=True)
    with pytest.raises(PromptFailed) as info:
        run(comfy_server, wf)
    err = info.value
    assert err.node_id == "11" and err.node_type == "SteadfastHash"
    assert "HashMismatchError" in (err.exception_type or "")
    assert wrong in err.exception_message and good in err.exception_message
    assert "MISMATCH" in err.exception_message
    assert comfy_server.is_running()


def test_hash_mismatch_without_fail_only_reports(comfy_server: ComfyServer,
                                                 reference: str) -> None:
    wf, good = workflow("determinism_check", steps=STEPS), reference
    wf["11"]["inputs"].update(expected=_flip(good), fail_on_mismatch=False)
    entry = run(comfy_server, wf)
    assert ui(entry, "11")["steadfast_hash"][0] == {"hash": good, "match": "mismatch"}
    assert "MISMATCH" in text(entry, "11")


@pytest.mark.parametrize("expected", ["full", "prefix"])
def test_hash_with_the_right_expected_passes(comfy_server: ComfyServer, reference: str,
                                             expected: str) -> None:
    wf, good = workflow("determinism_check", steps=STEPS), reference
    wf["11"]["inputs"].update(expected=good if expected == "full" else good[:12].upper(), fail_on_mismatch=True)
    entry = run(comfy_server, wf)
    check_ui_lists(entry)
    assert ui(entry, "11")["steadfast_hash"][0] == {"hash": good, "match": "match"}
    assert "MATCH" in text(entry, "11") and "MISMATCH" not in text(entry, "11")


def test_malformed_expected_is_rejected_by_validation(comfy_server: ComfyServer,
                                                      reference: str) -> None:
    wf = workflow("determinism_check", steps=STEPS)
    wf["11"]["inputs"]["expected"] = "zz"
    with pytest.raises(PromptRejected) as info:
        comfy_server.queue(only(wf, "11"))  # the Hash as the only output: ComfyUI answers 400
    assert "11" in info.value.node_errors
    detail = str(info.value.node_errors["11"])
    assert "hex SHA-256" in detail and "'zz'" in detail


def test_malformed_expected_with_fail_on_mismatch_fails_loudly(comfy_server: ComfyServer,
                                                               reference: str) -> None:
    """ComfyUI drops an output node that fails validation and runs the others (SaveImage here), so a
    check that must fail the prompt is never skipped that way: it fails at execution instead."""
    wf = workflow("determinism_check", steps=STEPS)
    wf["11"]["inputs"].update(expected="zz", fail_on_mismatch=True)
    with pytest.raises(PromptFailed) as info:
        run(comfy_server, wf)
    assert info.value.node_id == "11"
    assert "'zz'" in info.value.exception_message and "hex" in info.value.exception_message


def _images(w1: int, w2: int) -> dict[str, Any]:
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": w1, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "EmptyImage", "inputs": {"width": w2, "height": 8, "batch_size": 1, "color": 0}},
        "3": {"class_type": "SteadfastCompare", "inputs": {"image_a": ["1", 0], "image_b": ["2", 0]}},
    }


def test_compare_mismatched_shapes_names_both(comfy_server: ComfyServer) -> None:
    with pytest.raises(PromptFailed) as info:
        run(comfy_server, _images(8, 16))
    err = info.value
    assert err.node_id == "3" and "CompareShapeError" in (err.exception_type or "")
    assert "(1, 8, 8, 3)" in err.exception_message and "(1, 8, 16, 3)" in err.exception_message


def test_compare_same_shapes_works(comfy_server: ComfyServer) -> None:
    entry = run(comfy_server, _images(8, 8))
    assert compare_of(entry, "3")["identical"] is True


@pytest.mark.parametrize("inputs, message", [
    ({}, "nothing to compare"),
    ({"image_a": ["1", 0]}, "connect both image_a and image_b"),
    ({"latent_a": ["2", 0]}, "connect both latent_a and latent_b"),
])
def test_compare_with_missing_inputs(comfy_server: ComfyServer, inputs: dict, message: str) -> None:
    wf = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "3": {"class_type": "SteadfastCompare", "inputs": inputs},
    }
    with pytest.raises(PromptFailed) as info:
        run(comfy_server, wf)
    assert info.value.node_id == "3" and message in info.value.exception_message


@pytest.mark.parametrize("backend", ["efficient", "cudnn"])
def test_attention_backend_missing_on_cpu_names_working_ones(comfy_server: ComfyServer, backend: str) -> None:
    wf = workflow("optimized_vs_baseline", steps=STEPS)
    wf["13"]["inputs"].update(attention=backend, backend="eager")
    with pytest.raises(PromptFailed) as info:
        run(comfy_server, wf)
    err = info.value
    assert err.node_id == "13" and "UnsupportedBackendError" in (err.exception_type or "")
    msg = err.exception_message
    assert f"'{backend}'" in msg and "'cpu'" in msg
    working = msg.split("Backends that work there:")[1]
    assert "math" in working and "flash" in working and backend not in working


def test_compile_failure_falls_back_to_eager_visibly(comfy_server: ComfyServer) -> None:
    """fullgraph=True with ComfyUI's own attention: on CPU that is sub-quadratic attention, which Dynamo
    cannot trace in one graph, so compiling raises. The prompt must still succeed, run eager (bit-equal
    to the uncompiled baseline), and say so in the sampler's text, its run record and compile_state.

    Backend aot_eager is used by no other test: Dynamo shares compiled code between compile calls with
    the same backend, so an earlier non-fullgraph compile of this code would be reused without failing.
    """
    wf = workflow("optimized_vs_baseline", steps=STEPS)
    wf["13"]["inputs"].update(attention="comfy", compile="regional", backend="aot_eager", fullgraph=True)
    entry = run(comfy_server, wf)
    check_ui_lists(entry)
    shown = text(entry, "7")
    assert "COMPILE FAILED -> ran EAGER" in shown
    comp = record_of(entry, "7")["fingerprint"]["compile"]
    assert comp["disabled"] is True and comp["backend"] == "aot_eager" and comp["fallbacks"]
    assert comp["fallbacks"][-1][:100] in shown  # the reason itself is shown, not just "failed"
    records = [r for r in compile_records(comfy_server) if r["options"]["backend"] == "aot_eager"]
    assert len(records) == 1
    rec = records[0]
    assert rec["disabled"] is True and rec["options"]["fullgraph"] is True
    assert rec["fallbacks"] and rec["fallbacks"][0]["kind"] == "disabled" and rec["fallbacks"][0]["reason"]
    assert rec["errors"] and rec["errors"][0]["error"].startswith(rec["fallbacks"][0]["reason"].splitlines()[0])
    # the eager fallback with ComfyUI's attention equals the uncompiled baseline, bit for bit
    assert compare_of(entry, "14")["identical"] is True
    assert compare_of(entry, "10")["identical"] is True
