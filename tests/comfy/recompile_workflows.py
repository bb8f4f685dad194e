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
from steadfast_workflows import build_lora, compile_records, record_of, run
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
    mode: str = "default",
    width: int = 64,
    height: int = 64,
    batch: int = 1,
    warm: str | None = None,
    cache: str = "",
    steps: int = STEPS,
) -> dict[str, Any]:
    """The graph. ``det``: None = no Determinism Setup, else its ``strict`` value. ``lora``: (file, strength).
    ``warm``: None = no Warmup node, else its ``sizes`` input (width x height are warmed too). ``mode``: Optimize
    Model's ``torch.compile`` mode."""
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
            "mode": mode,
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


def precompiled_against_jit(
    comfyui: Path | None,
    ckpt: Path,
    folder: Path,
    *,
    cpu: bool,
    extra_args: list[str] | None = None,
    lora: tuple[str, float] | None = None,
    startup_timeout: float = 120.0,
    **kw: Any,
) -> dict[str, Any]:
    """The precompiled route's differential check in fresh server processes: ``saved`` (the route on,
    ``$STEADFAST_PRECOMPILED=1``, an empty compile cache ``folder/cache``: its jit compiles and saves the artifacts),
    ``loaded`` (the same install restarted on that cache, the route on: answered by them) and ``jit`` (another
    server, ``$STEADFAST_PRECOMPILED=0``, its own empty cache ``folder/cache_jit``: the jit of the same
    configuration). The restart is of the same install because
    the artifacts name the pack's modules as ComfyUI imports them, by its folder (docs/measurements.md).

    Args:
        comfyui, ckpt: the ComfyUI checkout (None: ``$COMFYUI_PATH``) and the tiny checkpoint (served as
            ``TINY_CKPT_NAME``).
        folder: a fresh folder (the caches, the LoRA file).
        cpu: ``--cpu`` (False: ComfyUI's own device, the GPU).
        extra_args: ComfyUI's command line (``--novram``, ``--fp8_e4m3fn-unet``...).
        lora: (file name, strength), the file built by :func:`build_lora`.
        startup_timeout: seconds each server may take to answer (a GPU server initialises CUDA first).
        kw: :func:`build`'s (``backend`` defaults to inductor, ``warm`` to the sampled size).
    Returns:
        ``{"saved" | "loaded" | "jit" | "other_seed": {"hash", "state", "graphs", "compile"}}`` (``state``: the
        newest compile record's precompiled route, ``graphs``: the graphs Dynamo compiled for that record;
        ``other_seed``: the restarted process again with ``seed + 1``, so that equal hashes are not those of an
        output that ignores its input).
    """
    loras = {}
    if lora is not None:
        build_lora(ckpt, folder / lora[0])
        loras = {lora[0]: folder / lora[0]}
    kw = {"backend": "inductor", "warm": "", "lora": lora, **kw}
    out: dict[str, Any] = {}

    def server(route: str, cache: str) -> ComfyServer:
        env = {"STEADFAST_COMPILE_CACHE": str(folder / cache), "STEADFAST_PRECOMPILED": route}
        return ComfyServer(
            {TINY_CKPT_NAME: ckpt},
            loras=loras,
            comfyui=comfyui,
            env=env,
            extra_args=list(extra_args or ()),
            cpu=cpu,
            startup_timeout=startup_timeout,
        )

    def one(srv: ComfyServer, **more: Any) -> dict[str, Any]:
        r = go(srv, **{**kw, **more})
        rec = max(compile_records(srv), key=lambda c: c["created"])
        return {"hash": r["hash"], "state": rec["precompiled"], "graphs": rec["graphs"], "compile": r["compile"]}

    with server("1", "cache") as srv:
        out["saved"] = one(srv)
        srv.restart()
        out["loaded"] = one(srv)
        out["other_seed"] = one(srv, seed=kw.get("seed", 42) + 1)
    with server("0", "cache_jit") as srv:
        out["jit"] = one(srv)
    return out


#: the cases of the precompiled route's differential check (:func:`precompiled_against_jit` keywords) that issue 35
#: names for CUDA: ComfyUI's defaults (Dynamic VRAM on a GPU), lowvram partial loading with a LoRA, fp8 weights and
#: ``mode=reduce-overhead`` (CUDA graphs on a GPU). ``--novram`` is refused with ``--cpu`` (one argparse group).
PRECOMPILED_CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "novram + LoRA": {
        "extra_args": ["--novram", "--disable-dynamic-vram"],
        "lora": ("steadfast_precompiled_case_lora.safetensors", 1.0),
    },
    "fp8 weights": {"extra_args": ["--fp8_e4m3fn-unet"]},
    "reduce-overhead": {"mode": "reduce-overhead"},
}


def judge_precompiled(r: dict[str, Any]) -> tuple[str, str]:
    """The verdict on :func:`precompiled_against_jit`'s result: ``("pass", ...)`` when the restarted process was
    answered by the artifacts (hits, no graph traced, no fallback) with the jit's bytes (the saving process's and the
    ``$STEADFAST_PRECOMPILED=0`` process's) and another seed changed them; ``("refused", ...)`` when it ran the jit
    instead, with the jit's bytes and the reason named; ``("fail", ...)`` otherwise (other bytes, or no answer from
    the artifacts and no reason)."""
    saved, loaded, jit, other = r["saved"], r["loaded"], r["jit"], r["other_seed"]
    state = loaded["state"]
    same = loaded["hash"] == jit["hash"] == saved["hash"]
    detail = (
        f"saved {saved['state']['saves']}, loaded {state['loads']}, hits {state['hits']}, fallbacks "
        f"{state['fallbacks']}, graphs traced after the restart {loaded['graphs']}; hash {loaded['hash'][:12]} "
        f"(jit {jit['hash'][:12]}, saving process {saved['hash'][:12]}, seed + 1 {other['hash'][:12]})"
    )
    if not same or other["hash"] == loaded["hash"]:
        return "fail", "bytes differ from the jit's, or ignore the seed: " + detail
    if state["hits"] > 0 and loaded["graphs"] == 0 and state["fallbacks"] == 0:
        return "pass", detail
    reasons = {**saved["state"].get("reasons", {}), **state.get("reasons", {})}
    if reasons:
        return "refused", f"the jit ran, reason: {next(iter(reasons.values()))}; " + detail
    return "fail", "not answered by the artifacts, and no reason named: " + detail
