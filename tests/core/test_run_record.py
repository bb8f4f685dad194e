"""The one run-record schema of both samplers: validation, JSON round trip, the node's summary text."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from steadfast.core.record.fingerprint import environment_fingerprint
from steadfast.core.record.hashing import tensor_digest
from steadfast.core.record.run_record import RunRecord


def _record(**changes) -> RunRecord:
    latent = torch.arange(2 * 4 * 8 * 8, dtype=torch.float32).reshape(2, 4, 8, 8)
    fields = dict(kind="model", seeds=[7, 8], batch_seed_mode="incremental", steps=4, cfg=7.0, denoise=1.0,
                  sampler="euler", scheduler="normal", output="latent", output_shape=list(latent.shape),
                  output_sha256=tensor_digest(latent), fingerprint=environment_fingerprint(attention="math"),
                  details={"per_step_noise": "cpu"})
    fields.update(changes)
    return RunRecord(**fields)


def test_json_round_trip_gives_the_same_record() -> None:
    rec = _record(compile={"mode": "regional", "backend": "eager", "status": "warm", "graphs": 1, "recompiles": 0},
                  seconds=0.25)
    text = rec.as_json()
    back = RunRecord.from_json(text)
    assert back == rec and json.loads(text) == back.as_dict()
    assert set(back.as_dict()) == {f.name for f in dataclasses.fields(RunRecord)}


@pytest.mark.parametrize("changes, message", [
    ({"kind": "ksampler"}, "kind must be one of"),
    ({"output": "video"}, "output must be one of"),
    ({"output_sha256": "abc"}, "64 lowercase hex"),
    ({"seeds": [7]}, "1 seeds for an output of shape [2, 4, 8, 8]"),
])
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
    comp = {"mode": "regional", "backend": "inductor", "status": "disabled", "graphs": 2, "recompiles": 1,
            "recompile_reasons_this_run": ["size changed"], "warnings": ["near the recompile limit"],
            "disabled": True, "fallbacks": ["Unsupported: graph break"]}
    text = _record(compile=comp, recompiles_this_run=1).summary_text()
    assert "this run: 1 recompile(s)" in text and "recompiled: size changed" in text
    assert "WARNING: near the recompile limit" in text
    assert text.endswith("COMPILE FAILED -> ran EAGER: Unsupported: graph break")


def test_pipeline_summary_names_pipeline_lora_and_compile_label() -> None:
    image = torch.zeros(1, 16, 16, 3)
    rec = _record(kind="pipeline", seeds=[3], batch_seed_mode="incremental", sampler="EulerDiscreteScheduler",
                  scheduler="pipeline's own", output="image", output_shape=list(image.shape),
                  output_sha256="0" * 64, seconds=1.5,
                  compile={"label": "StableDiffusionPipeline.unet (regional)", "status": "warm", "graphs": 1,
                           "recompiles": [{"reason": "x"}]},
                  details={"pipeline": "StableDiffusionPipeline", "dtype": "fp32",
                           "lora": {"name": "a.safetensors", "rank": 4, "max_rank": 4},
                           "lora_events": ["loaded LoRA a.safetensors"]})
    lines = rec.summary_text().splitlines()
    assert lines[0].startswith("image sha256 0000000000000000")
    assert lines[1].startswith("StableDiffusionPipeline (fp32), scheduler EulerDiscreteScheduler") and "1.50 s" in lines[1]
    assert lines[2] == "LoRA a.safetensors: loaded LoRA a.safetensors"
    assert lines[3].startswith("compile StableDiffusionPipeline.unet (regional): warm, 1 graph(s), 1 recompile(s)")
