"""What a first-time user reads: reports as lines (no Python reprs), tooltips that promise only what holds.

Over HTTP on the tiny SD1.5 checkpoint (the session server).
"""

from __future__ import annotations

import re

import pytest
from comfy_server import ComfyServer
from steadfast_workflows import run, text, workflow

pytestmark = pytest.mark.comfyui

DICT_REPR = re.compile(r"\{\s*['\"][\w.]+['\"]\s*:")  # {'backend': ... / {"mode": ...


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_optimize_report_is_lines_not_a_dict(comfy_server: ComfyServer, backend: str) -> None:
    """Optimize Model's report used to print the compile options as ``{'backend': 'eager', 'mode': None ...}``."""
    wf = workflow("optimized_vs_baseline", steps=2)
    wf["13"]["inputs"].update(compile="regional", backend=backend)
    entry = run(comfy_server, wf)
    report = text(entry, "13")
    assert not DICT_REPR.search(report), report
    assert f"backend {backend}, mode default, dynamic " in report and "fullgraph off" in report, report
    for node, out in entry["outputs"].items():  # no node of the template shows a dict repr
        shown = "\n".join(x for x in out.get("text", []) if isinstance(x, str))
        assert not DICT_REPR.search(shown), (node, shown)


def test_incremental_tooltip_says_what_needs_determinism_setup(comfy_server: ComfyServer) -> None:
    """``incremental`` alone makes item i's NOISE equal to a single run at seed + i; the latent needs
    Determinism Setup's batch_invariant (tests/comfy/test_batch_invariance.py), the image VAE Decode
    (Steadfast). The tooltip must not promise equal items on its own."""
    spec = comfy_server.get("/object_info/SteadfastSeededSampler")["SteadfastSeededSampler"]
    tip = spec["input"]["required"]["batch_seed_mode"][1]["tooltip"]
    assert "NOISE equal, not the result" in tip, tip
    assert "Determinism Setup" in tip and "batch_invariant" in tip and "VAE Decode (Steadfast)" in tip, tip
    assert "item i of a batch equals a single run" not in tip


def test_diffusers_template_without_a_model_says_what_to_put_where(comfy_server: ComfyServer) -> None:
    """The Diffusers template names a pipeline a new user does not have: the loader's validation error (shown on
    the node) says where a pipeline goes, its layout, and the command that writes the tiny one."""
    from comfy_server import PromptRejected

    wf = workflow("pipeline_generate")
    name = wf["1"]["inputs"]["pipeline_name"]
    with pytest.raises(PromptRejected) as info:
        comfy_server.queue(wf)
    errors = info.value.node_errors["1"]["errors"]
    assert [e["extra_info"]["input_name"] for e in errors] == ["pipeline_name"], errors  # the input at fault only
    detail = errors[0]["details"]
    assert f"{name!r} not found in models/diffusers" in detail, detail
    assert "model_index.json" in detail and "tiny-pipeline models/diffusers/steadfast-tiny-sd" in detail, detail


def test_slow_run_after_free_is_the_whole_graph_re_executing_not_a_recompile(comfy_server: ComfyServer) -> None:
    """The issue's finding (runs after ``POST /free`` took seconds, their records said 0 graphs, 0 recompiles)
    explained: ``free_memory`` makes ComfyUI drop its executor caches (``main.py``: ``e.reset()``), so the next
    prompt re-runs EVERY node - the checkpoint is read from disk again, the prompts re-encoded, Optimize Model
    runs on the new model object (a new compile record). Dynamo reuses the code it compiled for the same blocks:
    the new record's first call compiles nothing. ``unload_models`` alone keeps the cached outputs."""
    from recompile_workflows import build

    def cached(seed: int) -> tuple[list[str], dict]:
        entry = run(comfy_server, build(backend="eager", seed=seed))
        nodes = next((d["nodes"] for ev, d in entry["status"]["messages"] if ev == "execution_cached"), [])
        state = comfy_server.get("/steadfast/compile_state")["records"]
        regional = [r for r in state if r["label"].startswith("UNetModel (regional)")]
        # records are held weakly: one is gone when ComfyUI's cache released its model (the session server
        # uses the classic cache so that this does not depend on free RAM: tests/comfy/conftest.py)
        assert regional, (
            "no UNetModel (regional) record: the model object of this run was released",
            [r["label"] for r in state],
        )
        return sorted(nodes), regional[-1]  # the newest record: the model object this run used

    run(comfy_server, build(backend="eager", seed=1))
    before, rec_before = cached(2)
    assert {"ckpt", "pos", "neg", "opt"} <= set(before)  # a plain rerun: only the sampler side runs
    # ComfyServer.free waits until the worker applied the flags: a bare POST /free races the next prompt (the
    # worker may run it first, then reset its caches, dropping that run's model and its weak compile record)
    comfy_server.free(unload_models=True, free_memory=True)
    after, rec_after = cached(3)
    assert after == [], after  # everything re-executed: the checkpoint loaded again
    assert rec_after["graphs"] == 0 and rec_after["recompiles"] == [], rec_after  # no compile: code reused
    # a bare POST here: free()'s marker prompt would itself evict the outputs (the classic cache keeps the last
    # prompt's), and without free_memory the worker resets nothing, so there is no race to wait out
    comfy_server.post("/free", {"unload_models": True, "free_memory": False})
    assert {"ckpt", "pos", "neg", "opt"} <= set(cached(4)[0])  # unload only: outputs stay cached
