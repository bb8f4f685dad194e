"""Optimize Model runs the plan type the pipeline path uses (``core/optimize/plan.py``): its widgets are validated
into an ``OptimizeOptions``, then an ordered list of steps from ``nodes/patches`` runs, each returning a
``StepReport``; the node's report is their lines. In-process on the CPU through ``optimize_plan_child.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = [pytest.mark.comfyui, pytest.mark.slow]


@pytest.fixture(scope="module")
def result(run_child: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    return run_child("optimize_plan_child.py")


def test_widgets_are_validated_into_the_shared_plan_type(result: dict[str, Any]) -> None:
    assert result["compile_choices"] == ["off", "regional", "full"]
    assert result["bad_quantize"].startswith("quantize: ")
    assert "needs backend 'inductor'" in result["preset_off_inductor_compiling"]
    assert result["preset_off_inductor_not_compiling"] == "accepted"  # no effect, said in the report
    assert "compile must be one of off, regional, full" in result["bad_scope"]
    assert result["same_type"] is True and result["scope"] == "off" and result["compile_backend"] == "eager"


def test_steps_run_in_order_and_the_report_is_their_lines(result: dict[str, Any]) -> None:
    assert result["steps"] == [["precision", True], ["attention", True], ["qkv_fusion", True], ["channels_last", True]]
    assert result["all_step_reports"] is True and result["clone_not_input"] is True
    assert result["plan_text"] == result["node_text"]
    assert result["node_text"].splitlines() == [
        "precision: fp32, compute torch.float32 (weights torch.float32; ComfyUI's set_model_compute_dtype)",
        "attention: PyTorch SDPA, backend math on cpu (torch.float32); backend math runs in every probed case",
        "qkv_fusion: 8 attention modules fused",
        "channels_last: conv weights converted during sampling, restored after",
    ]


def test_compile_comes_last_and_a_preset_without_compile_is_a_note(result: dict[str, Any]) -> None:
    assert result["compile_steps"] == ["precision", "attention", "qkv_fusion", "compile"]
    assert result["compile_modules"] and all(p.startswith("diffusion_model.") for p in result["compile_modules"])
    assert result["preset_steps"][-1] == [
        "inductor_preset",
        False,
        ["inductor_preset diffusers-fast: no effect (compile is off)"],
    ]
