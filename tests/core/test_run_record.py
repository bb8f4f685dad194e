"""The one run-record schema of both samplers: validation, JSON round trip, the node's summary text, and the one
builder both samplers call (``for_model``, ``for_pipeline``)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from steadfast.core.determinism.noise import item_seeds
from steadfast.core.record import run_record
from steadfast.core.record.environment import environment_fingerprint, fingerprint_digest
from steadfast.core.record.hashing import hash_image, tensor_digest
from steadfast.core.record.run_record import RunRecord


def _record(**changes) -> RunRecord:
    latent = torch.arange(2 * 4 * 8 * 8, dtype=torch.float32).reshape(2, 4, 8, 8)
    fields = dict(
        kind="model",
        seeds=[7, 8],
        batch_seed_mode="incremental",
        steps=4,
        cfg=7.0,
        denoise=1.0,
        sampler="euler",
        scheduler="normal",
        output="latent",
        output_shape=list(latent.shape),
        output_sha256=tensor_digest(latent),
        fingerprint=environment_fingerprint(attention="math"),
        details={"per_step_noise": "cpu"},
    )
    fields.update(changes)
    return RunRecord(**fields)


def test_json_round_trip_gives_the_same_record() -> None:
    rec = _record(
        compile={"mode": "regional", "backend": "eager", "status": "warm", "graphs": 1, "recompiles": 0}, seconds=0.25
    )
    text = rec.as_json()
    back = RunRecord.from_json(text)
    assert back == rec and json.loads(text) == back.as_dict()
    assert set(back.as_dict()) == {f.name for f in dataclasses.fields(RunRecord)}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"kind": "ksampler"}, "kind must be one of"),
        ({"output": "video"}, "output must be one of"),
        ({"output_sha256": "abc"}, "64 lowercase hex"),
        ({"seeds": [7]}, "1 seeds for an output of shape [2, 4, 8, 8]"),
    ],
)
def test_bad_fields_are_refused_naming_the_field(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _record(**changes)


def test_from_json_names_missing_and_unknown_fields() -> None:
    data = _record().as_dict()
    del data["seeds"]
    data["latent_sha256"] = data["output_sha256"]
    with pytest.raises(ValueError, match=r"missing fields \['seeds'\], unknown fields \['latent_sha256'\]"):
        RunRecord.from_json(json.dumps(data))
    with pytest.raises(ValueError, match="must be a JSON object"):
        RunRecord.from_json("[1, 2]")
    with pytest.raises(ValueError, match="not JSON"):
        RunRecord.from_json("{")


def test_summary_depends_on_the_record() -> None:
    a, b = _record(), _record(output_sha256="f" * 64, seeds=[1, 2])
    assert a.summary_text() != b.summary_text()
    assert a.summary_text().startswith(f"latent sha256 {a.output_sha256[:16]}")
    assert "seeds [1, 2]" in b.summary_text() and "euler/normal" in a.summary_text()
    assert "attention math" in a.summary_text()


def test_summary_shows_recompile_reasons_and_a_compile_failure_loudly() -> None:
    comp = {
        "mode": "regional",
        "backend": "inductor",
        "status": "disabled",
        "graphs": 2,
        "recompiles": 1,
        "recompile_reasons_this_run": ["size changed"],
        "warnings": ["near the recompile limit"],
        "disabled": True,
        "fallbacks": ["Unsupported: graph break"],
    }
    text = _record(compile=comp, recompiles_this_run=1).summary_text()
    assert "this run: 1 recompile(s)" in text and "recompiled: size changed" in text
    assert "WARNING: near the recompile limit" in text
    assert text.endswith("COMPILE FAILED -> ran EAGER: Unsupported: graph break")


def test_pipeline_summary_names_pipeline_lora_and_compile_label() -> None:
    image = torch.zeros(1, 16, 16, 3)
    rec = _record(
        kind="pipeline",
        seeds=[3],
        batch_seed_mode="incremental",
        sampler="EulerDiscreteScheduler",
        scheduler="pipeline's own",
        output="image",
        output_shape=list(image.shape),
        output_sha256="0" * 64,
        seconds=1.5,
        compile={
            "label": "StableDiffusionPipeline.unet (regional)",
            "status": "warm",
            "graphs": 1,
            "recompiles": [{"reason": "x"}],
        },
        details={
            "pipeline": "StableDiffusionPipeline",
            "dtype": "fp32",
            "lora": {"name": "a.safetensors", "rank": 4, "max_rank": 4},
            "lora_events": ["loaded LoRA a.safetensors"],
        },
    )
    lines = rec.summary_text().splitlines()
    assert lines[0].startswith("image sha256 0000000000000000")
    assert (
        lines[1].startswith("StableDiffusionPipeline (fp32), scheduler EulerDiscreteScheduler")
        and "1.50 s" in lines[1]
    )
    assert lines[2] == "LoRA a.safetensors: loaded LoRA a.safetensors"
    assert lines[3].startswith("compile StableDiffusionPipeline.unet (regional): warm, 1 graph(s), 1 recompile(s)")


# ----------------------------------------------------------------------------- the one builder of both samplers

HOST = {"comfyui": "0.33.0", "steadfast": "9.9.9", "dynamic_vram": False, "comfy_fast": []}


def _model(**changes) -> RunRecord:
    latent = torch.arange(3 * 4 * 2 * 2, dtype=torch.float32).reshape(3, 4, 2, 2)
    args = {
        "seed": 7,
        "batch": 3,
        "batch_seed_mode": "incremental",
        "steps": 4,
        "cfg": 7.0,
        "denoise": 1.0,
        "sampler": "euler",
        "scheduler": "normal",
        "samples": latent,
        "settings": {"device": "cpu", "attention": "math"},
        "host": HOST,
        "during": {"num_threads": 99, "flags": {"measured": "inside"}, "cpu_settings": {"threads": 99}},
        "compile": {"mode": "regional", "recompiles_this_run": 2},
        "model_identity": {"digest": "d", "cached": True},
        "model_file": {"file": "m.safetensors"},
        "seconds": 0.123456,
        "details": {"per_step_noise": "cpu"},
    }
    args.update(changes)
    return run_record.for_model(**args)


def _pipeline(**changes) -> RunRecord:
    images = torch.linspace(0, 1, 3 * 2 * 2 * 3).reshape(3, 2, 2, 3)
    args = {
        "seed": 7,
        "batch": 3,
        "steps": 4,
        "cfg": 7.0,
        "scheduler_class": "EulerDiscreteScheduler",
        "images": images,
        "environment": environment_fingerprint(pipeline_class="X"),
        "host": HOST,
        "determinism": "not set",
        "compile": None,
        "recompiles_this_run": 0,
        "seconds": 0.123456,
        "details": {"prompt": "a"},
    }
    args.update(changes)
    return run_record.for_pipeline(**args)


def test_both_samplers_build_the_common_fields_with_one_builder() -> None:
    """Seeds (item_seeds), the ComfyUI host facts in the fingerprint, the timing and the digest rule are the same
    code for the MODEL and the pipeline path; what differs is the path's own fields."""
    m, p = _model(), _pipeline()
    assert m.seeds == p.seeds == item_seeds(7, 3) == [7, 8, 9]
    assert m.seconds == p.seconds == 0.1235
    for rec in (m, p):
        assert {k: rec.fingerprint[k] for k in HOST} == HOST
        assert set(environment_fingerprint()) <= set(rec.fingerprint)  # the built-in environment fields
        assert RunRecord.from_json(rec.as_json()) == rec
    latent = torch.arange(3 * 4 * 2 * 2, dtype=torch.float32).reshape(3, 4, 2, 2)
    assert m.output_sha256 == tensor_digest(latent) and m.output_shape == [3, 4, 2, 2]
    assert p.output_sha256 == hash_image(torch.linspace(0, 1, 3 * 2 * 2 * 3).reshape(3, 2, 2, 3))
    assert (m.kind, m.output, p.kind, p.output) == ("model", "latent", "pipeline", "image")


def test_model_record_fields_in_order_and_as_measured_during_sampling() -> None:
    rec = _model()
    keys = list(rec.fingerprint)
    builtin = list(environment_fingerprint())
    assert keys == builtin + ["device", "attention", *HOST, "flags_measured"]  # the JSON's field order
    assert (rec.fingerprint["num_threads"], rec.fingerprint["flags"]) == (99, {"measured": "inside"})
    assert (
        rec.fingerprint["cpu_settings"] == {"threads": 99} and rec.fingerprint["flags_measured"] == "during sampling"
    )
    assert rec.model == {"digest": "d", "file": "m.safetensors"} and rec.recompiles_this_run == 2
    assert rec.batch_seed_mode == "incremental" and rec.details == {"per_step_noise": "cpu"}
    after = _model(during={}, compile="off", batch_seed_mode="comfy")
    assert after.fingerprint["flags_measured"] == "after sampling (no step callback ran)"
    assert after.recompiles_this_run == 0 and after.seeds == [7, 7, 7]


def test_pipeline_record_ends_its_fingerprint_with_the_policy_and_digests_it() -> None:
    rec = _pipeline(compile={"label": "X.unet (regional)"}, recompiles_this_run=1)
    assert list(rec.fingerprint)[-1] == "determinism" and rec.fingerprint["determinism"] == "not set"
    assert list(rec.details) == ["prompt", "fingerprint_digest"]
    assert rec.details["fingerprint_digest"] == fingerprint_digest(rec.fingerprint)
    assert rec.batch_seed_mode == "incremental (one CPU generator per image)" and rec.denoise == 1.0
    assert (rec.sampler, rec.scheduler, rec.model) == ("EulerDiscreteScheduler", "pipeline's own", {})
    assert rec.recompiles_this_run == 1 and _pipeline().compile == "off"


def test_builder_refuses_a_batch_its_output_does_not_have() -> None:
    with pytest.raises(ValueError, match="2 seeds for an output of shape"):
        _model(batch=2)
    with pytest.raises(ValueError, match="exceeds"):
        _pipeline(seed=2**64 - 2)
