"""A node's report does not vanish when ComfyUI answers it from cache: Determinism Setup, Optimize and Warmup are
output nodes, so a re-run without /free sends their cached report again (canvas) and keeps it in /history."""

from __future__ import annotations

import pytest
from comfy_server import ComfyServer
from steadfast_workflows import cached_nodes, run, text, workflow

pytestmark = pytest.mark.comfyui


@pytest.mark.parametrize(
    "name,reporting",
    [
        ("determinism_check", ["SteadfastDeterminismSetup"]),
        ("warmup_then_generate", ["SteadfastOptimizeModel", "SteadfastWarmup"]),
    ],
)
def test_reports_survive_a_cached_rerun(comfy_server: ComfyServer, name: str, reporting: list[str]) -> None:
    wf = workflow(name, steps=2)
    ids = [i for i, n in wf.items() if n["class_type"] in reporting]
    assert len(ids) == len(reporting)
    comfy_server.free()
    first = run(comfy_server, wf)
    second = run(comfy_server, wf)
    assert set(ids) <= set(cached_nodes(second))  # really answered from cache
    for i in ids:
        assert text(first, i) and text(second, i) == text(first, i), (name, i)
