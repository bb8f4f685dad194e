"""Hash checks and bad inputs through the HTTP API: each failure must be loud and say what to fix.

Validation errors come back as ``PromptRejected`` (HTTP 400, ``node_errors``), execution errors as
``PromptFailed`` (``status_str: "error"`` in ``/history``, with the node and exception message).
A graph break under ``fullgraph`` is an error (that is what fullgraph means in torch).
"""

from __future__ import annotations

from typing import Any

import pytest
from comfy_server import ComfyServer, PromptFailed, PromptRejected
from steadfast_workflows import (
    check_ui_lists,
    compare_of,
    hash_of,
    only,
    run,
    text,
    ui,
    workflow,
)

pytestmark = pytest.mark.comfyui

STEPS = 3


@pytest.fixture(scope="module")
def reference(comfy_server: ComfyServer) -> str:
    """The hash the Hash node (id 11) of determinism_check reports (taken from a run, never hard-coded)."""
    return hash_of(run(comfy_server, workflow("determinism_check", steps=STEPS)), "11")


def _flip(h: str) -> str:
    return h[:-1] + ("0" if h[-1] != "0" else "1")


def test_hash_mismatch_fails_the_prompt_naming_both_hashes(comfy_server: ComfyServer, reference: str) -> None:
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


def test_hash_mismatch_without_fail_only_reports(comfy_server: ComfyServer, reference: str) -> None:
    wf, good = workflow("determinism_check", steps=STEPS), reference
    wf["11"]["inputs"].update(expected=_flip(good), fail_on_mismatch=False)
    entry = run(comfy_server, wf)
    shown = ui(entry, "11")["steadfast_hash"][0]
    assert (shown["hash"], shown["match"]) == (good, "mismatch")
    assert "MISMATCH" in text(entry, "11")


@pytest.mark.parametrize("expected", ["full", "prefix"])
def test_hash_with_the_right_expected_passes(comfy_server: ComfyServer, reference: str, expected: str) -> None:
    wf, good = workflow("determinism_check", steps=STEPS), reference
    wf["11"]["inputs"].update(expected=good if expected == "full" else good[:12].upper(), fail_on_mismatch=True)
    entry = run(comfy_server, wf)
    check_ui_lists(entry)
    shown = ui(entry, "11")["steadfast_hash"][0]
    assert (shown["hash"], shown["match"]) == (good, "match")
    assert "MATCH" in text(entry, "11") and "MISMATCH" not in text(entry, "11")


def test_malformed_expected_is_rejected_by_validation(comfy_server: ComfyServer, reference: str) -> None:
    wf = workflow("determinism_check", steps=STEPS)
    wf["11"]["inputs"]["expected"] = "zz"
    with pytest.raises(PromptRejected) as info:
        comfy_server.queue(only(wf, "11"))  # the Hash as the only output: ComfyUI answers 400
    assert "11" in info.value.node_errors
    detail = str(info.value.node_errors["11"])
    assert "hex SHA-256" in detail and "'zz'" in detail
    # the input at fault and no other (ComfyUI marks every argument of validate_inputs)
    assert [e["extra_info"]["input_name"] for e in info.value.node_errors["11"]["errors"]] == ["expected"]


def test_malformed_expected_with_fail_on_mismatch_fails_loudly(comfy_server: ComfyServer, reference: str) -> None:
    """ComfyUI drops an output node that fails validation and runs the others (SaveImage here), answering with the
    error in ``node_errors``: the harness refuses such a prompt as a whole, naming ``expected`` alone."""
    wf = workflow("determinism_check", steps=STEPS)
    wf["11"]["inputs"].update(expected="zz", fail_on_mismatch=True)
    with pytest.raises(PromptRejected) as info:
        run(comfy_server, wf)
    errors = info.value.node_errors["11"]["errors"]
    assert [e["extra_info"]["input_name"] for e in errors] == ["expected"]
    assert "'zz'" in errors[0]["details"] and "hex" in errors[0]["details"]


@pytest.mark.parametrize("sizes, item", [("512x512, 7x", "'7x'"), ("512x512 4x64", "4 is outside")])
def test_warmup_sizes_validated_up_front_naming_the_input(comfy_server: ComfyServer, sizes: str, item: str) -> None:
    wf = workflow("warmup_then_generate", steps=STEPS)
    warm = next(i for i, n in wf.items() if n["class_type"] == "SteadfastWarmup")
    wf[warm]["inputs"]["sizes"] = sizes
    with pytest.raises(PromptRejected) as info:
        comfy_server.queue(wf)
    errors = info.value.node_errors[warm]["errors"]
    assert [e["extra_info"]["input_name"] for e in errors] == ["sizes"], errors
    assert errors[0]["details"].startswith("sizes - ") and item in errors[0]["details"]
    assert repr(sizes) in errors[0]["details"], errors  # the whole value


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


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({}, "nothing to compare"),
        ({"image_a": ["1", 0]}, "connect both image_a and image_b"),
        ({"latent_a": ["2", 0]}, "connect both latent_a and latent_b"),
    ],
)
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


def test_fullgraph_graph_break_fails_the_run_naming_it(comfy_server: ComfyServer) -> None:
    """fullgraph=True with ComfyUI's own attention: on CPU that is sub-quadratic attention, which Dynamo
    cannot trace in one graph. As the fullgraph tooltip says, the graph break fails the run (at the sampler
    that compiles); it does not silently run eager. The error says what Dynamo could not trace (psutil's
    ``open`` under ``get_free_memory``), where (module paths, innermost last), and what to do: the
    ``fullgraph`` switch of Optimize Model, or an SDPA attention.

    Backend aot_eager is used by no other test: Dynamo shares compiled code between compile calls with
    the same backend, so an earlier non-fullgraph compile of this code would be reused without failing.
    """
    wf = workflow("optimized_vs_baseline", steps=STEPS)
    wf["5"]["inputs"]["batch_invariant"] = False  # on, it pins attention to SDPA, which traces in one graph
    wf["13"]["inputs"].update(attention="comfy", compile="regional", backend="aot_eager", fullgraph=True)
    with pytest.raises(PromptFailed) as info:
        run(comfy_server, wf)
    err = info.value
    assert err.node_id == "7" and err.node_type == "SteadfastSeededSampler", err.exception_message
    msg = err.exception_message
    assert (err.exception_type or "").endswith("FullgraphBreakError"), err.exception_type
    assert "graph break under fullgraph=True" in msg and "`open`" in msg, msg
    assert "get_free_memory (comfy/model_management.py:" in msg and "where (innermost last)" in msg, msg
    assert "switch `fullgraph` off" in msg and "Optimize Model" in msg and "SDPA attention" in msg, msg


@pytest.mark.parametrize("name, value", [("dynamic", "bogus"), ("compile", "bogus"), ("attention", "sdpa")])
def test_unknown_optimize_choice_is_rejected_by_comfyui_validation(
    comfy_server: ComfyServer, name: str, value: str
) -> None:
    """No ``validate_inputs(**kwargs)`` on our nodes: ComfyUI's own combo check names the input and the value
    (before, ``dynamic='bogus'`` reached execute and failed with a bare ``KeyError: 'bogus'``)."""
    wf = workflow("optimized_vs_baseline", steps=STEPS)
    wf["13"]["inputs"][name] = value
    with pytest.raises(PromptRejected) as info:
        comfy_server.queue(wf)
    errors = info.value.node_errors["13"]["errors"]
    assert any(
        e["type"] == "value_not_in_list"
        and e["extra_info"]["input_name"] == name
        and e["extra_info"]["received_value"] == value
        for e in errors
    ), errors


@pytest.mark.parametrize("node, workflow_name", [("13", "optimized_vs_baseline"), ("15", "warmup_then_generate")])
def test_a_clip_wired_into_model_is_rejected_by_type(comfy_server: ComfyServer, node: str, workflow_name: str) -> None:
    """Optimize and Warmup take a plain MODEL: a CLIP is refused by ComfyUI's type check before anything runs
    (it used to pass a MODEL-or-pipeline input and fail at run time with an AttributeError)."""
    wf = workflow(workflow_name, steps=STEPS)
    wf[node]["inputs"]["model"] = ["1", 1]  # CheckpointLoaderSimple's CLIP
    with pytest.raises(PromptRejected) as info:
        comfy_server.queue(wf)
    errors = info.value.node_errors[node]["errors"]
    assert any(
        e["type"] == "return_type_mismatch" and e["extra_info"]["input_name"] == "model" and "CLIP" in e["details"]
        for e in errors
    ), errors
