"""The Hash node's verdict travels as a file: a JSON in ``output/steadfast_verdicts/``, listed as an output file
(``ui["files"]``) so that any API client (and the Comfy API v2, which keeps only outputs with a file name) can
download it; no absolute server path in it; ``verdict_file`` off writes none, and a workflow saved before the input
existed gets the file (the default)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comfy_server import ComfyServer
from steadfast_workflows import check_ui_lists, record_of, run, ui, workflow

from steadfast.core.paths import find_absolute_paths
from steadfast.core.record import verdict_file

pytestmark = pytest.mark.comfyui

STEPS = 2


def _download(server: ComfyServer, entry: dict, node: str) -> tuple[dict, dict]:
    (listed,) = ui(entry, node)["files"]
    return listed, verdict_file.parse(server.view(listed))


def test_hash_lists_a_verdict_file_with_hash_dtype_shape_record(comfy_server: ComfyServer) -> None:
    wf = workflow("determinism_check", steps=STEPS)
    del wf["11"]["inputs"]["verdict_file"]  # as a workflow saved before the input existed: the default (on) holds
    entry = run(comfy_server, wf)
    check_ui_lists(entry)
    listed, doc = _download(comfy_server, entry, "11")
    assert listed["type"] == "output" and listed["subfolder"] == verdict_file.SUBFOLDER
    assert listed["filename"].endswith(".json") and "/" not in listed["filename"]
    shown = ui(entry, "11")["steadfast_hash"][0]
    assert doc["hash"] == shown["hash"] and len(doc["hash"]) == 64
    assert (doc["kind"], doc["dtype"], doc["source_dtype"]) == ("image", "torch.uint8", "torch.float32")
    assert doc["shape"] == [1, 64, 64, 3]  # determinism_check: one 64x64 RGB image
    assert doc["record"] == record_of(entry, "6")  # Hash's run_record input is sampler 6's
    assert doc["match"] == "unchecked" and doc["verdict"] is None
    assert doc["reference"] == shown["reference"]
    # a second run (node caches dropped: a cached Hash lists its first file again) gets its own file
    comfy_server.free(unload_models=False, free_memory=True)
    listed2, doc2 = _download(comfy_server, run(comfy_server, wf), "11")
    assert listed2["filename"] != listed["filename"] and doc2["hash"] == doc["hash"]


def test_verdict_file_off_writes_none(comfy_server: ComfyServer) -> None:
    wf = workflow("determinism_check", steps=STEPS)
    wf["11"]["inputs"]["verdict_file"] = False
    entry = run(comfy_server, wf)
    assert "files" not in ui(entry, "11") and ui(entry, "11")["steadfast_hash"][0]["hash"]


def test_a_mismatch_verdict_names_no_server_path(comfy_server: ComfyServer, tmp_path: Path) -> None:
    """The explanation of a mismatch quotes recorded values: one that holds an absolute path of this machine is
    shown redacted in the file, as in every client-facing text."""
    wf = workflow("determinism_check", steps=STEPS)
    comfy_server.free(unload_models=False, free_memory=True)  # the sampler runs, so its record is in the entry
    entry = run(comfy_server, wf)
    good = ui(entry, "11")["steadfast_hash"][0]["hash"]
    record = record_of(entry, "6")
    secret = str(Path.home() / "private-models" / "secret_model.safetensors")
    assert find_absolute_paths([secret]), "the planted value must count as an absolute path of this machine"
    record["sampler_name"] = secret
    wf["11"]["inputs"].update(
        expected=good[:-1] + ("0" if good[-1] != "0" else "1"), expected_record=json.dumps(record)
    )
    entry = run(comfy_server, wf)
    _, doc = _download(comfy_server, entry, "11")
    assert doc["match"] == "mismatch" and "sampler_name" in doc["explanation"]
    assert "secret_model.safetensors" in doc["explanation"]  # the value is named ...
    text = json.dumps(doc)
    assert secret not in text and not find_absolute_paths([text])  # ... but not where it lies
    assert doc["verdict"] is not None and doc["verdict"]["level"]
