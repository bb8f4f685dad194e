"""``GET /steadfast/compile_state`` keeps a model's compile history after ``POST /free`` (issue 37).

The registry holds records by weak reference to the model, so before issue 37 a ``/free`` (which the README
suggests between reproducible runs) made the route forget the compile that had just run. Over HTTP on the real
server: compile (regional, eager backend: Dynamo tracing, no C++ compiler), ``/free``, read the route, run again.
"""

from __future__ import annotations

from typing import Any

import pytest
from comfy_server import ComfyServer
from steadfast_workflows import add, compile_records, record_of, run

pytestmark = pytest.mark.comfyui

OPTIMIZE = dict(
    qkv_fusion=False,
    channels_last=False,
    attention="auto",
    compile="regional",
    backend="eager",
    mode="default",
    dynamic="auto",
    fullgraph=False,
    strict_recompiles=False,
    compile_cache="",
)


def _workflow(seed: int) -> tuple[dict[str, Any], str]:
    wf: dict[str, Any] = {
        "ckpt": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "steadfast_tiny_sd15.safetensors"}},
        "pos": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse", "clip": ["ckpt", 1]}},
        "lat": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
    }
    opt = add(wf, "SteadfastOptimizeModel", model=["ckpt", 0], **OPTIMIZE)
    samp = add(
        wf,
        "SteadfastSeededSampler",
        model=[opt, 0],
        seed=seed,
        steps=2,
        cfg=1.0,
        sampler_name="euler",
        scheduler="normal",
        positive=["pos", 0],
        negative=["pos", 0],
        latent_image=["lat", 0],
        denoise=1.0,
        batch_seed_mode="incremental",
    )
    add(wf, "SteadfastHash", latent=[samp, 0])
    return wf, samp


def test_compile_state_survives_free(comfy_server: ComfyServer) -> None:
    comfy_server.free()
    wf, samp = _workflow(seed=11)
    entry = run(comfy_server, wf)
    shown = record_of(entry, samp)["fingerprint"]["compile"]
    assert shown["status"] == "warm" and shown["backend"] == "eager"
    live = max((r for r in compile_records(comfy_server) if r["status"] != "released"), key=lambda r: r["created"])
    assert live["options"]["backend"] == "eager" and live["calls"] >= 2

    comfy_server.free()  # ComfyUI drops the model: its record must stay, marked released
    state = comfy_server.get("/steadfast/compile_state")
    assert state["released_kept"] == 32
    (kept,) = [r for r in state["records"] if r["created"] == live["created"]]
    assert kept["status"] == "released" and kept["status_at_release"] == "warm"
    assert kept["label"] == live["label"] and kept["blocks"] == live["blocks"]
    assert kept["compile_seconds"] == live["first_call_seconds"] and kept["compile_seconds"] > 0
    assert kept["recompile_count"] == len(live["recompiles"])
    assert kept["recompile_reasons"] == [e["reason"] for e in live["recompiles"]]
    assert kept["calls"] == live["calls"] and kept["graphs"] == live["graphs"]
    assert kept["warm_in_this_process"] is True and kept["warm_from_compile_cache"] is False
    assert "after a restart: cold (backend 'eager'" in kept["next_run"]

    # what it said holds: the reloaded model (a new record) compiles nothing in this process
    wf, samp = _workflow(seed=12)
    again = record_of(run(comfy_server, wf), samp)["fingerprint"]["compile"]
    assert again["status"] == "warm" and again["graphs"] == 0 and again["recompiles_this_run"] == 0
    records = compile_records(comfy_server)
    assert [r["status"] for r in records if r["created"] == live["created"]] == ["released"]
    assert max(records, key=lambda r: r["created"])["status"] == "warm"  # the new live record, listed after
