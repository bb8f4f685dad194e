"""Determinism policy: every global flag is set, read back, and restored exactly.

Covers ``core/determinism/apply.py`` (application), ``core/determinism/policy.py`` (policy, description, report),
``core/determinism/torch_state.py`` (snapshot / restore), ``core/determinism/cublas.py`` and
``core/record/environment.py`` (it reports the same flags).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys

import numpy as np
import pytest
import torch

from steadfast.core import torch_compat
from steadfast.core.determinism import apply as det
from steadfast.core.determinism import cublas as cublas_config
from steadfast.core.determinism.apply import apply_policy, deterministic, seed_everything
from steadfast.core.determinism.policy import DeterminismPolicy, describe_policy
from steadfast.core.determinism.torch_state import restore_state, snapshot_state
from steadfast.core.record.environment import environment_fingerprint, fingerprint_digest

matmul = torch.backends.cuda.matmul
HAS_FP32_API = torch_compat.has_fp32_precision_api()


@pytest.fixture(autouse=True)
def _isolate_global_state():
    """Every test leaves torch's global flags and RNG exactly as it found them."""
    before = snapshot_state()
    rng = torch.get_rng_state()
    yield
    restore_state(before)
    torch.set_rng_state(rng)
    assert snapshot_state() == before


def test_snapshot_as_dict_equals_the_deep_copy_it_replaces() -> None:
    """``TorchGlobalState.as_dict`` reads its fields directly (it is on the precompiled route's per-model-call
    path): the same dict as ``dataclasses.asdict`` with ``fp32_precision`` as a dict, for the state as it is and
    with the flags moved (so a field the direct read missed or mangled fails here)."""
    import dataclasses

    for variant in (None, 0, 1):
        if variant is not None:
            _dirty_state(variant)
        state = snapshot_state(load_inductor=True)
        slow = {**dataclasses.asdict(state), "fp32_precision": dict(state.fp32_precision)}
        assert state.as_dict() == slow and list(state.as_dict()) == list(slow)


def _dirty_state(variant: int) -> None:
    """A non-default state where every flag is the opposite of what a strict policy sets."""
    torch.use_deterministic_algorithms(variant == 1, warn_only=variant == 1)
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.benchmark = True
    torch.backends.mkldnn.deterministic = False
    torch.set_float32_matmul_precision("medium" if variant == 1 else "high")
    torch.backends.cudnn.allow_tf32 = True
    matmul.allow_fp16_reduced_precision_reduction = True
    matmul.allow_bf16_reduced_precision_reduction = True
    matmul.allow_fp16_accumulation = True
    import torch.utils.deterministic as tud

    tud.fill_uninitialized_memory = True
    torch.set_num_threads(1)


def _raw_flags() -> dict:
    """The flags read straight from torch (not through snapshot_state)."""
    import torch.utils.deterministic as tud

    return {
        "det": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_det": torch.backends.cudnn.deterministic,
        "benchmark": torch.backends.cudnn.benchmark,
        "mkldnn_det": torch.backends.mkldnn.deterministic,
        "tf32_mm": matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "precision": torch.get_float32_matmul_precision(),
        "fp16_red": matmul.allow_fp16_reduced_precision_reduction,
        "bf16_red": matmul.allow_bf16_reduced_precision_reduction,
        "fp16_acc": matmul.allow_fp16_accumulation,
        "fill": tud.fill_uninitialized_memory,
        "threads": torch.get_num_threads(),
    }


def test_apply_sets_every_flag_and_returns_previous_state():
    _dirty_state(0)
    dirty = snapshot_state()
    previous = apply_policy(DeterminismPolicy(strict=True, num_threads=2, fill_uninitialized_memory=False))
    assert previous == dirty
    flags = _raw_flags()
    assert flags == {
        "det": True,
        "warn_only": False,
        "cudnn_det": True,
        "benchmark": False,
        "mkldnn_det": True,
        "tf32_mm": False,
        "tf32_cudnn": False,
        "precision": "highest",
        "fp16_red": False,
        "bf16_red": False,
        "fp16_acc": False,
        "fill": False,
        "threads": 2,
    }
    import torch._inductor.config as inductor_config

    assert inductor_config.deterministic is True  # side effect of use_deterministic_algorithms
    if HAS_FP32_API:
        state = dict(snapshot_state().fp32_precision)
        for leaf in ("cuda.matmul", "cuda.conv", "cuda.rnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn"):
            assert state[leaf] == "ieee", leaf


@pytest.mark.parametrize("variant", [0, 1])
def test_restore_round_trips_every_flag(variant):
    _dirty_state(variant)
    dirty_raw, dirty = _raw_flags(), snapshot_state()
    apply_policy(DeterminismPolicy(strict=True, num_threads=2, seed=5, fill_uninitialized_memory=False))
    applied_raw = _raw_flags()
    changed = {k for k in dirty_raw if dirty_raw[k] != applied_raw[k]}
    # every flag was actually changed by the policy (variant 1 starts in warn-only deterministic mode)
    assert changed == set(dirty_raw) - {"warn_only" if variant == 0 else "det"}
    restore_state(dirty)
    assert _raw_flags() == dirty_raw
    assert snapshot_state() == dirty


@pytest.mark.skipif(not HAS_FP32_API, reason="torch < 2.9 has no per-backend fp32_precision API")
@pytest.mark.parametrize("setup", ["generic_tf32", "cuda_matmul_tf32", "mkldnn_bf16", "high_then_legacy_off"])
def test_restore_exact_with_new_fp32_precision_api(setup):
    """Mixed legacy/new TF32 states (where legacy getters raise) still round-trip exactly."""
    if setup == "generic_tf32":
        torch.backends.fp32_precision = "tf32"
    elif setup == "cuda_matmul_tf32":
        matmul.fp32_precision = "tf32"
    elif setup == "mkldnn_bf16":
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    else:
        torch.set_float32_matmul_precision("high")
        matmul.allow_tf32 = False
    before = snapshot_state()
    apply_policy(DeterminismPolicy())
    after_apply = snapshot_state()
    assert after_apply.float32_matmul_precision == "highest"
    assert after_apply.cuda_matmul_allow_tf32 is False and after_apply.cudnn_allow_tf32 is False
    restore_state(before)
    assert snapshot_state() == before


def test_restore_puts_back_an_independent_inductor_flag():
    import torch._inductor.config as inductor_config

    inductor_config.deterministic = True  # e.g. TORCHINDUCTOR_DETERMINISTIC=1, algorithms off
    try:
        before = snapshot_state()
        assert before.deterministic_algorithms is False and before.inductor_deterministic is True
        with deterministic(DeterminismPolicy()):
            pass
        assert inductor_config.deterministic is True
    finally:
        inductor_config.deterministic = False


def test_context_restores_on_exception():
    _dirty_state(0)
    dirty_raw = _raw_flags()
    with pytest.raises(RuntimeError, match="boom"):
        with deterministic(DeterminismPolicy(num_threads=2, seed=1)) as report:
            assert torch.are_deterministic_algorithms_enabled()
            assert report.applied["deterministic_algorithms"] is True
            raise RuntimeError("boom")
    assert _raw_flags() == dirty_raw


def test_context_restores_rng_state_when_it_seeds():
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    with deterministic(DeterminismPolicy(seed=99)):
        inside = torch.rand(4)
    after = torch.rand(4)
    assert torch.equal(after, expected)
    torch.manual_seed(99)
    assert torch.equal(inside, torch.rand(4))


def test_report_content_strict_pinned():
    with deterministic(DeterminismPolicy(strict=True, num_threads=1, seed=3)) as report:
        assert torch.get_num_threads() == 1
    applied = report.applied
    assert applied["deterministic_algorithms"] is True and applied["deterministic_warn_only"] is False
    assert applied["num_threads"] == 1 and applied["num_threads_pinned"] is True
    assert applied["seed"] == 3
    assert applied["CUBLAS_WORKSPACE_CONFIG"] == os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    assert not any("thread" in item for item in report.not_guaranteed)
    assert not any("warn_only" in item for item in report.not_guaranteed)
    assert not any("reads" in item for item in report.not_guaranteed)  # every flag read back as set
    if not torch.cuda.is_available():
        assert report.not_guaranteed == []
    assert any("inductor" in note for note in report.notes)
    text = report.as_text()
    assert "deterministic_algorithms: True" in text and "num_threads: 1" in text
    json.dumps(report.as_dict())  # JSON-safe
    assert set(report.as_dict()) == {"applied", "not_guaranteed", "notes"}


def test_report_lists_what_is_not_guaranteed():
    with deterministic(DeterminismPolicy(strict=False, allow_tf32=True)) as report:
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.get_float32_matmul_precision() == "high"
    items = " | ".join(report.not_guaranteed)
    assert "warn_only" in items
    assert f"thread count not pinned (currently {torch.get_num_threads()})" in items
    assert "TF32" in items
    assert report.applied["num_threads_pinned"] is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuBLAS checks need CUDA")
def test_report_flags_bad_cublas_config(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    with deterministic(DeterminismPolicy(num_threads=1)) as report:
        pass
    assert any("CUBLAS_WORKSPACE_CONFIG" in item for item in report.not_guaranteed)


def test_cublas_workspace_config_recorded_at_import():
    # the package __init__ calls ensure_cublas_workspace_config() before anything touches CUDA
    record = cublas_config.cublas_config_record()
    assert record is not None
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] in cublas_config.CUBLAS_DETERMINISTIC_VALUES
    assert record.value == os.environ["CUBLAS_WORKSPACE_CONFIG"]
    assert cublas_config.ensure_cublas_workspace_config() == cublas_config.cublas_config_effective()
    if not torch.cuda.is_initialized() and not record.cuda_initialized_before:
        assert cublas_config.cublas_config_effective() is True
    with pytest.raises(ValueError):
        cublas_config.ensure_cublas_workspace_config(":1:1")


def test_cublas_config_not_effective_when_changed(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    assert cublas_config.cublas_config_effective() is False
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    assert cublas_config.cublas_config_effective() is False


def _fake_cuda(monkeypatch, allocated: int) -> None:
    """CUDA initialised (as ComfyUI does before loading custom nodes), with ``allocated`` bytes ever allocated."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {"allocated_bytes.all.allocated": allocated})
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocated)


@pytest.mark.parametrize("allocated", [0, 4096])
def test_cublas_judged_by_a_cublas_call_not_by_cuda_init(monkeypatch, allocated):
    """Issue 24 item 8: CUDA initialised without any CUDA memory allocated means no cuBLAS call ran, so setting
    CUBLAS_WORKSPACE_CONFIG then is in time (no warning); after an allocation a cuBLAS call may have run (warning).
    The real GPU case: tests/comfy/test_gpu_correctness.py::test_cublas_config_judged_on_a_real_gpu."""
    _fake_cuda(monkeypatch, allocated)
    monkeypatch.setattr(cublas_config, "_cublas_record", None)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    effective = cublas_config.ensure_cublas_workspace_config()
    record = cublas_config.cublas_config_record()
    assert record.cuda_initialized_before is True and record.set_by_steadfast is True
    assert record.cublas_may_have_run is bool(allocated)
    assert effective is (not allocated)
    problem = cublas_config.cublas_problem()
    if allocated:
        assert "after CUDA memory was first allocated" in problem
    else:
        assert problem is None


def test_policy_default_turns_fill_uninitialized_memory_off_for_the_run():
    """Issue 24 item 8: the default policy switches fill_uninitialized_memory off while it applies (torch's default
    True memsets every torch.empty), and restores the previous value after."""
    tud = torch.utils.deterministic
    before = tud.fill_uninitialized_memory
    assert DeterminismPolicy().fill_uninitialized_memory is False
    with deterministic(DeterminismPolicy(num_threads=torch.get_num_threads())):
        assert tud.fill_uninitialized_memory is False
    assert tud.fill_uninitialized_memory == before
    assert "fill_uninitialized_memory: False" in describe_policy(DeterminismPolicy())


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(3)


def test_seed_everything_reproducible():
    seed_everything(42)
    a = _draws()
    seed_everything(42)
    b = _draws()
    seed_everything(43)
    c = _draws()
    assert a[:2] == b[:2] and torch.equal(a[2], b[2])
    assert a[0] != c[0] and a[1] != c[1] and not torch.equal(a[2], c[2])
    seed_everything(2**64 - 1)  # ComfyUI's largest seed; numpy gets seed % 2**32
    d = _draws()
    seed_everything(2**64 - 1)
    assert _draws()[0] == d[0]


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, True, "3"])
def test_seed_everything_rejects_bad_seeds(bad):
    with pytest.raises((TypeError, ValueError)):
        seed_everything(bad)


@pytest.mark.parametrize("kwargs", [{"num_threads": 0}, {"num_threads": -2}, {"seed": -1}, {"seed": 2**64}])
def test_policy_validation(kwargs):
    with pytest.raises(ValueError):
        DeterminismPolicy(**kwargs)


def test_enable_full_determinism_applies_and_pins_threads():
    threads = torch.get_num_threads()
    report = det.enable_full_determinism(seed=7, strict=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert report.applied["num_threads"] == threads and report.applied["num_threads_pinned"] is True
    assert report.applied["seed"] == 7
    a = torch.rand(2)
    torch.manual_seed(7)
    assert torch.equal(a, torch.rand(2))  # it seeded torch with 7


def test_snapshot_state_has_no_side_effects():
    import torch.utils.deterministic  # noqa: F401 - make sure the module itself is not what changes

    loaded = "torch._inductor.config" in sys.modules
    a = snapshot_state()
    b = snapshot_state()
    assert a == b
    if not loaded:  # reading does not import the (1 s) inductor config
        assert "torch._inductor.config" not in sys.modules
    assert isinstance(a.as_dict()["fp32_precision"], dict)
    json.dumps(a.as_dict())


# ----------------------------------------------------------------------------- fingerprint


def test_fingerprint_fields_and_flags():
    fp = environment_fingerprint(dtype=torch.bfloat16, attention="math", compile_mode=None, seeds=(1, 2))
    for key in ("torch", "python", "numpy", "platform", "cpu", "num_threads", "flags", "cuda_available"):
        assert key in fp
    assert fp["torch"] == torch.__version__ and fp["num_threads"] == torch.get_num_threads()
    assert fp["flags"]["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()
    assert fp["dtype"] == "torch.bfloat16" and fp["seeds"] == [1, 2] and fp["compile_mode"] is None
    json.dumps(fp, allow_nan=False)


def test_fingerprint_digest_is_stable_and_sensitive():
    fp = environment_fingerprint(dtype="fp32")
    digest = fingerprint_digest(fp)
    # the documented recipe, recomputed independently: SHA-256 of sorted, compact, ASCII JSON
    canonical = json.dumps(fp, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    assert digest == hashlib.sha256(canonical.encode("ascii")).hexdigest()
    assert fingerprint_digest(dict(reversed(list(fp.items())))) == digest  # key order irrelevant
    assert fingerprint_digest(environment_fingerprint(dtype="fp32")) == digest
    assert fingerprint_digest(environment_fingerprint(dtype="fp16")) != digest
    with deterministic(DeterminismPolicy(num_threads=1)):
        changed = fingerprint_digest(environment_fingerprint(dtype="fp32"))
    assert changed != digest  # flags and thread count are part of the fingerprint


def test_fingerprint_rejects_collisions_and_unstable_values():
    with pytest.raises(ValueError, match="torch"):
        environment_fingerprint(torch="other")
    with pytest.raises(TypeError):
        environment_fingerprint(model=object())


def test_describe_policy_does_not_apply_anything():
    before = _raw_flags()
    text = describe_policy(DeterminismPolicy(strict=False, allow_tf32=True))
    assert _raw_flags() == before
    assert "warn_only=True" in text and "TF32: allowed" in text
    assert "thread count not pinned" in text
    pinned = describe_policy(DeterminismPolicy(num_threads=1, seed=4))
    assert "threads: pinned to 1" in pinned and "seed: 4" in pinned
    assert "Not guaranteed: nothing known" in pinned or torch.cuda.is_available()


def test_policy_as_dict():
    d = DeterminismPolicy(num_threads=2, seed=9).as_dict()
    assert d == {"strict": True, "allow_tf32": False, "num_threads": 2, "seed": 9, "fill_uninitialized_memory": False}
    json.dumps(d)
