"""The one plan type of both optimize paths (``core/optimize/plan.py``): validation, ordered steps, step reports.

The MODEL path (Optimize Model, ``nodes/optimize_node.py``) and the pipeline path (``core/pipelines/optimize.py``)
both build an :class:`OptimizeOptions` and run :func:`run_steps`; the MODEL side is exercised in
``tests/comfy/test_optimize_model_plan.py``, the pipeline side in ``tests/core/test_pipelines.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

from steadfast.core import pipelines
from steadfast.core.compile import COMPILE_SCOPES as FACE_SCOPES
from steadfast.core.compile import CompileOptions as FaceCompileOptions
from steadfast.core.compile.options import COMPILE_SCOPES, CompileOptions
from steadfast.core.optimize.plan import OptimizeOptions, OptimizeReport, Step, StepReport, run_steps

# what pipeline run records (``optimize.options``) and verify reports have always held, in this order
LEGACY_KEYS = [
    "qkv_fusion",
    "qkv_fusion_vae",
    "channels_last",
    "attention",
    "vae_slicing",
    "vae_tiling",
    "compile",
    "backend",
    "mode",
    "dynamic",
    "fullgraph",
]


def test_one_type_and_one_list_of_scopes() -> None:
    assert COMPILE_SCOPES == ("off", "regional", "full")
    assert FACE_SCOPES is COMPILE_SCOPES and FaceCompileOptions is CompileOptions
    assert pipelines.OptimizeOptions is OptimizeOptions and pipelines.StepReport is StepReport
    assert pipelines.OptimizeReport is OptimizeReport
    assert not hasattr(pipelines, "PipelineOptions")


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"scope": "regionl"}, "compile must be one of off, regional, full"),
        ({"attention": " "}, "attention must be a backend name"),
        ({"compile": CompileOptions(backend="")}, "backend must be"),
    ],
)
def test_options_refuse_invalid_values(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        OptimizeOptions(**kwargs)


def test_compile_settings_must_be_held_whole() -> None:
    with pytest.raises(TypeError, match="compile must be a CompileOptions, got dict"):
        OptimizeOptions(compile={"backend": "eager"})


def test_compile_options_are_held_whole() -> None:
    co = CompileOptions(
        backend="eager", mode="max-autotune", dynamic=False, fullgraph=True, options={"a": 1}, contiguous_inputs=False
    )
    o = OptimizeOptions(scope="regional", compile=co)
    assert o.compile is co
    d = o.as_dict()
    assert list(d)[: len(LEGACY_KEYS)] == LEGACY_KEYS
    assert (d["compile"], d["backend"], d["mode"], d["dynamic"], d["fullgraph"]) == (
        "regional",
        "eager",
        "max-autotune",
        False,
        True,
    )
    assert d["compile_options"] == {"options": {"a": 1}, "contiguous_inputs": False}


def test_as_dict_of_pipeline_options_has_exactly_the_legacy_fields() -> None:
    d = OptimizeOptions(qkv_fusion=True, scope="full", compile=CompileOptions(backend="eager")).as_dict()
    assert list(d) == LEGACY_KEYS
    assert d == {
        "qkv_fusion": True,
        "qkv_fusion_vae": True,
        "channels_last": False,
        "attention": "auto",
        "vae_slicing": False,
        "vae_tiling": False,
        "compile": "full",
        "backend": "eager",
        "mode": None,
        "dynamic": None,
        "fullgraph": False,
    }
    # MODEL-only settings are written only where set
    m = OptimizeOptions(precision="bf16", quantize="int8", strict_recompiles=True).as_dict()
    assert {k: m[k] for k in ("precision", "quantize", "strict_recompiles")} == {
        "precision": "bf16",
        "quantize": "int8",
        "strict_recompiles": True,
    }
    assert "compile_cache" not in m and "inductor_preset" not in m


def test_merged_keeps_switches_of_both_and_merges_compile_field_by_field() -> None:
    a = OptimizeOptions(qkv_fusion=True, compile=CompileOptions(mode="max-autotune"))
    b = OptimizeOptions(scope="regional", compile=CompileOptions(backend="eager"))
    m = a.merged(b)
    assert m.qkv_fusion and m.scope == "regional"
    assert m.compile == CompileOptions(backend="eager", mode="max-autotune")
    assert OptimizeOptions().is_baseline() and not m.is_baseline()
    assert not OptimizeOptions(precision="fp16").is_baseline()


def test_options_stay_hashable_for_the_pipeline_memo() -> None:
    a = OptimizeOptions(scope="full", compile=CompileOptions(backend="eager"))
    assert (
        hash(a) == hash(dataclasses.replace(a))
        and {a: 1}[OptimizeOptions(scope="full", compile=CompileOptions("eager"))] == 1
    )


def test_run_steps_runs_wanted_steps_in_order_and_keeps_what_ran_before_a_failure() -> None:
    ran: list[str] = []

    def step(name: str):
        def run() -> StepReport:
            ran.append(name)
            return StepReport(name, True)

        return run

    def boom() -> StepReport:
        raise RuntimeError("step failed")

    into: list[StepReport] = []
    out = run_steps([Step("a", True, step("a")), Step("b", False, step("b")), Step("c", True, step("c"))], into)
    assert out is into and [s.step for s in into] == ["a", "c"] == ran
    assert all(s.seconds >= 0.0 for s in into)
    kept: list[StepReport] = []
    with pytest.raises(RuntimeError, match="step failed"):
        run_steps([Step("a", True, step("a")), Step("x", True, boom), Step("c", True, step("c"))], kept)
    assert [s.step for s in kept] == ["a"]


def test_step_report_lines_are_text_only() -> None:
    worded = StepReport("qkv_fusion", True, ["a"], {"modules": 1}, lines=["qkv_fusion: 1 attention modules fused"])
    assert worded.as_text() == "qkv_fusion: 1 attention modules fused"
    assert "lines" not in worded.as_dict() and worded.as_dict()["details"] == {"modules": 1}
    composed = StepReport("vae_slicing", True, ["vae"])
    assert composed.as_text() == "vae_slicing: applied on vae"
    assert list(composed.as_dict()) == ["step", "applied", "modules", "details", "note", "seconds"]
