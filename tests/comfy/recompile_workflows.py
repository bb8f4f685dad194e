"""Workflow builder for the recompile and compile-cache tests (not a test module).

One compact API-format graph: checkpoint -> [Determinism Setup] -> [LoraLoaderModelOnly] -> Optimize
-> [Warmup] -> Seeded Sampler -> Hash (latent). Node ids are names ("opt", "samp" ...). The tests
read the sampler's run record (``fingerprint.compile``: per-run recompiles with reasons, replaced
parameters, ``weight_inplace_update``) and ``GET /steadfast/compile_state``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from comfy_server import ComfyServer
from steadfast_workflows import build_lora, record_of, run
from tiny_sd15 import CHECKPOINT_NAME as TINY_CKPT_NAME  # headless/ is on sys.path (tests/comfy/conftest.py)

STEPS = 2
PROMPT = "a lighthouse on a cliff at dawn, oil painting"


def build(
    *,
    seed: int = 42,
    prompt: str = PROMPT,
    lora: tuple[str, float] | None = None,
    det: bool | None = None,
    strict: bool = False,
    dynamic: str = "auto",
    attention: str = "auto",
    backend: str = "eager",
    compile: str = "regional",
    width: int = 64,
    height: int = 64,
    batch: int = 1,
    warm: str | None = None,
    cache: str = "",
    steps: int = STEPS,
) -> dict[str, Any]:
    """The graph. ``det``: None = no Determinism Setup, else its ``strict`` value. ``lora``: (file, strength).
    ``warm``: None = no Warmup node, else its ``sizes`` input (width x height are warmed too)."""
    wf: dict[str, Any] = {
        "ckpt": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "steadfast_tiny_sd15.safetensors"}},
        "pos": {"class_type": "CLIPTextEncode", "inputs": {"text": prompt, "clip": ["ckpt", 1]}},
        "neg": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry, low quality", "clip": ["ckpt", 1]}},
        "lat": {"class_type": "EmptyLatentImage", "inputs": {"width": width, "height": height, "batch_size": batch}},
    }
    model: list[Any] = ["ckpt", 0]
    if det is not None:
        wf["det"] = {
            "class_type": "SteadfastDeterminismSetup",
            "inputs": {"model": model, "strict": det, "allow_tf32": False, "num_threads": 0, "batch_invariant": False},
        }  # only the torch flags differ from a plain run
        model = ["det", 0]
    if lora is not None:
        wf["lora"] = {
            "class_type": "LoraLoaderModelOnly",
            "inputs": {"model": model, "lora_name": lora[0], "strength_model": lora[1]},
        }
        model = ["lora", 0]
    wf["opt"] = {
        "class_type": "SteadfastOptimizeModel",
        "inputs": {
            "model": model,
            "qkv_fusion": False,
            "channels_last": False,
            "attention": attention,
            "compile": compile,
            "backend": backend,
            "mode": "default",
            "dynamic": dynamic,
            "fullgraph": False,
            "strict_recompiles": strict,
            "compile_cache": cache,
        },
    }
    model = ["opt", 0]
    if warm is not None:
        wf["warm"] = {
            "class_type": "SteadfastWarmup",
            "inputs": {
                "model": model,
                "width": width,
                "height": height,
                "batch_size": batch,
                "cfg": 7.0,
                "positive": ["pos", 0],
                "negative": ["neg", 0],
                "sizes": warm,
            },
        }
        model = ["warm", 0]
    wf["samp"] = {
        "class_type": "SteadfastSeededSampler",
        "inputs": {
            "model": model,
            "seed": seed,
            "steps": steps,
            "cfg": 7.0,
            "sampler_name": "euler",
            "scheduler": "normal",
            "positive": ["pos", 0],
            "negative": ["neg", 0],
            "latent_image": ["lat", 0],
            "denoise": 1.0,
            "batch_seed_mode": "incremental",
        },
    }
    wf["hash"] = {"class_type": "SteadfastHash", "inputs": {"latent": ["samp", 0]}}
    return wf


def go(server: ComfyServer, timeout: float = 600.0, **kw: Any) -> dict[str, Any]:
    """Run :func:`build` (``kw``); returns ``{"entry", "record", "compile", "hash"}`` (compile = the run
    record's ``fingerprint.compile`` dict)."""
    entry = run(server, build(**kw), timeout=timeout)
    record = record_of(entry, "samp")
    return {
        "entry": entry,
        "record": record,
        "compile": record["fingerprint"]["compile"],
        "hash": record["output_sha256"],
    }


@contextlib.contextmanager
def server_with_lora(
    comfyui: Path, ckpt: Path, folder: Path, lora_name: str, env: dict[str, str] | None = None
) -> Iterator[ComfyServer]:
    """A fresh ComfyUI server (this pack loaded) with the tiny checkpoint as ``TINY_CKPT_NAME`` and a seeded
    rank-4 LoRA for it (:func:`steadfast_workflows.build_lora`, written to ``folder``) as ``lora_name``; ``env``:
    extra environment variables of the server process."""
    lora = folder / lora_name
    build_lora(ckpt, lora)
    with ComfyServer({TINY_CKPT_NAME: ckpt}, loras={lora_name: lora}, comfyui=comfyui, env=env) as srv:
        yield srv
