"""Precision and inductor-preset knobs in core: the preset table, its errors, the compile cache key, the compute
dtype names, and explain's labels for a precision / TF32 / preset difference ("changes bits")."""

from __future__ import annotations

import pytest
import torch

from steadfast.core.compile import presets as inductor_presets
from steadfast.core.compile.options import CompileOptions
from steadfast.core.compile.warm import cache as compile_cache
from steadfast.core.optimize import precision
from steadfast.core.record import explain


def test_diffusers_fast_is_the_published_recipe_and_inductor_knows_it() -> None:
    import torch._inductor.config as config

    preset = inductor_presets.preset_options("diffusers-fast", "inductor")
    assert preset == {
        "conv_1x1_as_mm": True,
        "coordinate_descent_tuning": True,
        "epilogue_fusion": False,
        "coordinate_descent_check_all_directions": True,
    }
    assert all(hasattr(config, k) for k in preset)  # torch.compile(options=...) refuses unknown keys
    preset["epilogue_fusion"] = True  # a fresh dict: the table cannot be edited through it
    assert inductor_presets.PRESETS["diffusers-fast"]["epilogue_fusion"] is False
    assert inductor_presets.preset_options("none", "eager") == {}


@pytest.mark.parametrize(
    "name,backend,match",
    [
        ("diffusers-fast", "eager", "needs backend 'inductor', got backend 'eager'"),
        ("diffusers-fast", "cudagraphs", "needs backend 'inductor'"),
        ("fastest", "inductor", "inductor_preset must be one of none, diffusers-fast"),
    ],
)
def test_preset_errors_are_clear(name: str, backend: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        inductor_presets.preset_options(name, backend)


def test_preset_merges_with_a_compile_mode() -> None:
    opts = CompileOptions(
        mode="max-autotune-no-cudagraphs", options=inductor_presets.preset_options("diffusers-fast", "inductor")
    )
    kwargs = opts.to_kwargs()
    assert kwargs["mode"] is None  # torch refuses mode with options: the mode's own config is merged under them
    assert kwargs["options"]["max_autotune"] is True and kwargs["options"]["epilogue_fusion"] is False


def test_cache_key_has_one_directory_per_preset_and_keeps_the_default() -> None:
    plain = compile_cache.cache_key_fields("cpu")
    assert compile_cache.cache_key_fields("cpu", inductor_options={}) == plain  # no preset: key unchanged
    fast = compile_cache.cache_key_fields("cpu", inductor_options=inductor_presets.PRESETS["diffusers-fast"])
    assert fast["inductor_options"]["conv_1x1_as_mm"] is True
    assert compile_cache.cache_key(fast) != compile_cache.cache_key(plain)


def test_precision_names() -> None:
    assert precision.precision_dtype("model") is None
    assert precision.precision_dtype("bf16", "cpu") is torch.bfloat16
    assert precision.precision_dtype("fp16", "cpu") is torch.float16
    assert precision.precision_dtype("fp32") is torch.float32
    with pytest.raises(ValueError, match="precision must be one of model, fp32, bf16, fp16, got 'int8'"):
        precision.precision_dtype("int8")


def _record(**fp: object) -> dict:
    return {
        "seeds": [1],
        "fingerprint": {
            "dtype": "torch.float32",
            "flags": {"cuda_matmul_allow_tf32": False, "float32_matmul_precision": "highest"},
            "compile": {"mode": "regional", "backend": "inductor"},
            **fp,
        },
    }


@pytest.mark.parametrize(
    "change,field,why",
    [
        ({"dtype": "torch.float32 (compute torch.bfloat16)"}, "fingerprint.dtype", "numeric precision"),
        (
            {"flags": {"cuda_matmul_allow_tf32": True, "float32_matmul_precision": "highest"}},
            "fingerprint.flags.cuda_matmul_allow_tf32",
            "TF32",
        ),
        (
            {"flags": {"cuda_matmul_allow_tf32": False, "float32_matmul_precision": "high"}},
            "fingerprint.flags.float32_matmul_precision",
            "TF32",
        ),
        (
            {"compile": {"mode": "regional", "backend": "inductor", "inductor_preset": "diffusers-fast"}},
            "fingerprint.compile.inductor_preset",
            "inductor config preset",
        ),
    ],
)
def test_explain_labels_precision_tf32_and_preset_as_changing_bits(change: dict, field: str, why: str) -> None:
    (diff,) = explain.explain(_record(), _record(**change)).diffs
    assert diff.field == field and diff.known and why in diff.why
    assert "[changes bits: " in diff.as_text()
