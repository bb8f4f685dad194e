"""Helpers for the node tests: load the API-format example workflows, edit them, run them on the
session ComfyUI server and read our nodes' results back from ``/history``.

Not a test module (no ``test_`` prefix). Imported by ``tests/comfy/test_nodes_*.py``; pytest puts this
folder on ``sys.path`` (rootdir-relative "prepend" import mode, no ``__init__.py`` here).
"""

from __future__ import annotations

import copy
import json
import time
from functools import cache
from pathlib import Path
from typing import Any

from comfy_server import ComfyServer, cached_nodes  # noqa: F401 (cached_nodes: the tests import it from here)

REPO_ROOT = Path(__file__).resolve().parents[2]
API_DIR = REPO_ROOT / "example_workflows" / "api"

Workflow = dict[str, dict[str, Any]]


@cache
def _load(name: str) -> str:
    return (API_DIR / f"{name}.json").read_text(encoding="utf-8")


def workflow(name: str, **sampler: Any) -> Workflow:
    """A fresh copy of ``example_workflows/api/<name>.json``; ``sampler`` kwargs update every
    ``SteadfastSeededSampler``'s inputs (e.g. ``steps=2``)."""
    wf: Workflow = json.loads(_load(name))
    if sampler:
        for node in nodes_of(wf, "SteadfastSeededSampler"):
            wf[node]["inputs"].update(sampler)
    return wf


def nodes_of(wf: Workflow, class_type: str) -> list[str]:
    """Ids of the nodes of ``class_type`` in ``wf`` (sorted numerically)."""
    return sorted((k for k, v in wf.items() if v["class_type"] == class_type), key=lambda k: (len(k), k))


def add(wf: Workflow, class_type: str, **inputs: Any) -> str:
    """Add a node (inputs: widget values, or ``[node_id, output_index]`` links); returns its id."""
    nid = str(max((int(k) for k in wf if k.isdigit()), default=0) + 1)
    wf[nid] = {"class_type": class_type, "inputs": dict(inputs)}
    return nid


def only(wf: Workflow, *keep: str) -> Workflow:
    """``wf`` reduced to the nodes ``keep`` and everything they depend on (inputs, transitively)."""
    out: Workflow = {}
    todo = list(keep)
    while todo:
        nid = todo.pop()
        if nid in out:
            continue
        out[nid] = copy.deepcopy(wf[nid])
        todo += [v[0] for v in wf[nid]["inputs"].values() if isinstance(v, list) and len(v) == 2]
    return out


def run(server: ComfyServer, wf: Workflow, timeout: float = 300.0) -> dict[str, Any]:
    """Queue ``wf``, wait, return the history entry; ``entry["seconds"]`` = wall seconds queue -> done."""
    t0 = time.perf_counter()
    entry = server.wait(server.queue(wf), timeout=timeout)
    entry["seconds"] = time.perf_counter() - t0
    return entry


def ui(entry: dict[str, Any], node: str) -> dict[str, Any]:
    """The ui dict node ``node`` returned (as stored in ``/history``); KeyError when it returned none."""
    outputs = entry["outputs"]
    if node not in outputs:
        raise KeyError(f"node {node} has no ui output; outputs of: {sorted(outputs)}")
    return outputs[node]


def text(entry: dict[str, Any], node: str) -> str:
    """The node's ``ui["text"]`` lines joined."""
    return "\n".join(ui(entry, node)["text"])


def hash_of(entry: dict[str, Any], node: str) -> str:
    """The 64-hex digest a ``SteadfastHash`` node reported."""
    return ui(entry, node)["steadfast_hash"][0]["hash"]


def compare_of(entry: dict[str, Any], node: str) -> dict[str, Any]:
    """The report dict of a ``SteadfastCompare`` node."""
    return ui(entry, node)["steadfast_compare"][0]


def record_of(entry: dict[str, Any], node: str) -> dict[str, Any]:
    """The full run record of a ``SteadfastSeededSampler`` node."""
    return ui(entry, node)["steadfast_run_record"][0]


def compile_records(server: ComfyServer) -> list[dict[str, Any]]:
    """``GET /steadfast/compile_state`` records, oldest first."""
    return server.get("/steadfast/compile_state")["records"]


def check_ui_lists(entry: dict[str, Any]) -> None:
    """Assert every ui value of every node is a list (ComfyUI merges ui dicts list-wise)."""
    for node, out in entry["outputs"].items():
        for key, value in out.items():
            assert isinstance(value, list), f"node {node} ui[{key!r}] is {type(value).__name__}, not a list"


def build_lora(ckpt: Path, out: Path, rank: int = 4, seed: int = 1234) -> int:
    """A kohya-style LoRA (``lora_unet_<path>.lora_up/.lora_down/.alpha``) for every to_q/to_k/to_v of
    the checkpoint's transformer blocks, seeded; returns the number of patched modules."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    prefix = "model.diffusion_model."
    with safe_open(str(ckpt), "pt") as f:
        for key in sorted(f.keys()):
            if (
                ".transformer_blocks." in key
                and key.rsplit(".", 2)[-2] in ("to_q", "to_k", "to_v")
                and key.endswith(".weight")
            ):
                n_out, n_in = f.get_slice(key).get_shape()
                name = "lora_unet_" + key[len(prefix) : -len(".weight")].replace(".", "_")
                tensors[f"{name}.lora_up.weight"] = torch.randn(n_out, rank, generator=gen) * 0.1
                tensors[f"{name}.lora_down.weight"] = torch.randn(rank, n_in, generator=gen) * 0.1
                tensors[f"{name}.alpha"] = torch.tensor(float(rank))
    save_file(tensors, str(out))
    return len(tensors) // 3
