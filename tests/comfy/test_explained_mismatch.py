"""Explained mismatches over HTTP: Hash gets the sampler's run_record and a reference record; a change of threads,
attention backend, compile, seed or model each names its own field; an identical environment explains nothing.

Graph: checkpoint -> [ModelMergeSubtract: other weights] -> Determinism Setup (threads) -> Optimize (attention,
compile: inductor, since the eager backend is bit-equal to eager and so causes no mismatch) -> Seeded Sampler
-> Hash(latent, run_record). The reference run's hash and record are pinned into
``expected`` / ``expected_record`` of each variant, as the canvas' pin action does.
"""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

import pytest
from comfy_server import ComfyServer, PromptFailed
from steadfast_workflows import hash_of, record_of, run, text, ui
from tiny_sd15 import CHECKPOINT_NAME

pytestmark = pytest.mark.comfyui

BASE = {"threads": 2, "attention": "auto", "compile": "off", "seed": 5, "other_model": False, "dtype": "default"}


def graph(
    threads: int,
    attention: str,
    compile: str,
    seed: int,
    other_model: bool,
    dtype: str = "default",
    expected: str = "",
    expected_record: str = "",
    fail: bool = False,
) -> dict[str, Any]:
    wf: dict[str, Any] = {
        "ckpt": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CHECKPOINT_NAME}},
        "pos": {"class_type": "CLIPTextEncode", "inputs": {"text": "a boat", "clip": ["ckpt", 1]}},
        "neg": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["ckpt", 1]}},
        "lat": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
    }
    model: list[Any] = ["ckpt", 0]
    if other_model:
        wf["sub"] = {
            "class_type": "ModelMergeSubtract",
            "inputs": {"model1": model, "model2": model, "multiplier": 0.01},
        }
        model = ["sub", 0]
    if dtype != "default":
        wf["dtype"] = {"class_type": "ModelComputeDtype", "inputs": {"model": model, "dtype": dtype}}
        model = ["dtype", 0]
    wf["det"] = {
        "class_type": "SteadfastDeterminismSetup",
        "inputs": {"model": model, "strict": True, "allow_tf32": False, "num_threads": threads},
    }
    wf["opt"] = {
        "class_type": "SteadfastOptimizeModel",
        "inputs": {
            "model": ["det", 0],
            "qkv_fusion": False,
            "channels_last": False,
            "attention": attention,
            "compile": compile,
            "backend": "inductor" if compile != "off" else "eager",
            "mode": "default",
            "dynamic": "true",
            "fullgraph": False,
        },
    }
    wf["samp"] = {
        "class_type": "SteadfastSeededSampler",
        "inputs": {
            "model": ["opt", 0],
            "seed": seed,
            "steps": 2,
            "cfg": 6.0,
            "sampler_name": "euler",
            "scheduler": "normal",
            "positive": ["pos", 0],
            "negative": ["neg", 0],
            "latent_image": ["lat", 0],
            "denoise": 1.0,
            "batch_seed_mode": "incremental",
        },
    }
    wf["hash"] = {
        "class_type": "SteadfastHash",
        "inputs": {
            "latent": ["samp", 0],
            "run_record": ["samp", 1],
            "expected": expected,
            "expected_record": expected_record,
            "fail_on_mismatch": fail,
        },
    }
    return wf


@pytest.fixture(scope="module")
def reference(comfy_server: ComfyServer) -> dict[str, Any]:
    entry = run(comfy_server, graph(**BASE))
    return {"hash": hash_of(entry, "hash"), "record": json.dumps(record_of(entry, "samp"))}


@pytest.mark.parametrize(
    "change,field",
    [
        ({"threads": 1}, "fingerprint.num_threads: 2 -> 1"),
        ({"attention": "math"}, "fingerprint.attention"),
        ({"compile": "regional"}, "fingerprint.compile"),
        ({"seed": 6}, "seeds: [5] -> [6]"),
        ({"other_model": True}, "model.digest"),
        ({"dtype": "bf16"}, 'fingerprint.dtype: "torch.float32" -> "torch.float32 (compute torch.bfloat16)"'),
    ],
)
def test_each_change_names_its_field(comfy_server: ComfyServer, reference: dict[str, Any], change, field) -> None:
    entry = run(
        comfy_server, graph(**{**BASE, **change}, expected=reference["hash"], expected_record=reference["record"])
    )
    shown = ui(entry, "hash")["steadfast_hash"][0]
    assert shown["match"] == "mismatch", change
    assert field in shown["explanation"] and "changes bits" in shown["explanation"], shown["explanation"]
    assert field in text(entry, "hash")
    assert json.loads(shown["record"])["seeds"]  # the current record travels with the hash (for the pin action)


def test_identical_environment_explains_nothing(comfy_server: ComfyServer, reference: dict[str, Any]) -> None:
    comfy_server.free(unload_models=False)
    entry = run(comfy_server, graph(**BASE, expected=reference["hash"], expected_record=reference["record"]))
    shown = ui(entry, "hash")["steadfast_hash"][0]
    assert shown["match"] == "match" and shown["explanation"] == ""


def test_model_record_names_digest_file_and_versions(
    comfy_server: ComfyServer, reference: dict[str, Any], tiny_ckpt
) -> None:
    rec = json.loads(reference["record"])
    assert len(rec["model"]["digest"]) == 64 and rec["model"]["file"] == CHECKPOINT_NAME
    assert rec["model"]["file_size"] == tiny_ckpt.stat().st_size and rec["model"]["tensors"] > 100
    running = comfy_server.get("/system_stats")["system"]["comfyui_version"]  # asked, not a literal
    assert rec["fingerprint"]["comfyui"] == running and rec["fingerprint"]["steadfast"]
    # what changed upstream and touches determinism (core/record/environment.py): present on every version
    for key in ("comfy_aimdo", "comfy_kitchen", "dynamic_vram", "comfy_fast", "comfy_numeric_args"):
        assert key in rec["fingerprint"], key
    assert rec["fingerprint"]["dynamic_vram"] is False  # --cpu: ComfyUI never enables Dynamic VRAM on the CPU
    assert rec["fingerprint"]["comfy_fast"] == []
    for key, dist in (("comfy_aimdo", "comfy-aimdo"), ("comfy_kitchen", "comfy-kitchen")):  # the server's venv is ours
        try:
            want = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            want = None
        assert rec["fingerprint"][key] == want, key


def test_fail_on_mismatch_error_carries_the_explanation(comfy_server: ComfyServer, reference: dict[str, Any]) -> None:
    with pytest.raises(PromptFailed) as info:
        run(
            comfy_server,
            graph(**{**BASE, "seed": 7}, expected=reference["hash"], expected_record=reference["record"], fail=True),
        )
    assert "MISMATCH" in info.value.exception_message and "seeds: [5] -> [7]" in info.value.exception_message


def test_bad_expected_record_is_refused_naming_it(comfy_server: ComfyServer) -> None:
    """Checked when the Hash runs (validate_inputs takes ``expected`` alone, so that a bad ``expected`` marks no
    other input): the error names the input."""
    with pytest.raises(PromptFailed) as info:
        run(comfy_server, graph(**BASE, expected_record="{not json"))
    assert info.value.exception_message.startswith("expected_record: "), info.value.exception_message
