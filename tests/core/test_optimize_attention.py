"""SDPA backend pinning and probing, and the measured parity between CPU backends."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from steadfast.core.optimize import attention as attn_mod
from steadfast.core.optimize.attention import (
    SDPA_BACKENDS,
    UnsupportedBackendError,
    available_sdpa_backends,
    check_sdpa_backend,
    clear_sdpa_backend_cache,
    sdpa_context,
)
from steadfast.core.record.compare import compare_outputs


def _qkv(b=1, length=256, heads=4, dim_head=64, seed=0):
    """Seeded q, k, v as SDPA takes them: ``[b, heads, length, dim_head]`` float32."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, heads, length, dim_head, generator=g) for _ in range(3))


def _sdpa(backend, q, k, v):
    with torch.inference_mode(), sdpa_context(backend):
        return F.scaled_dot_product_attention(q, k, v)


def test_backend_names():
    assert SDPA_BACKENDS == ("auto", "math", "efficient", "flash", "cudnn")
    with pytest.raises(ValueError, match="unknown SDPA backend 'xformers'"):
        sdpa_context("xformers")
    with pytest.raises(ValueError, match="unknown"):
        check_sdpa_backend("fast")


def test_sdpa_context_sets_and_restores_torch_flags():
    before = (torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled())
    with sdpa_context("math"):
        assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    with sdpa_context("flash"):
        assert torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.math_sdp_enabled()
    with sdpa_context("auto"):
        assert (torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()) == before
    assert (torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()) == before


def test_available_backends_on_cpu_are_found_by_trying_and_cached():
    clear_sdpa_backend_cache()
    avail = available_sdpa_backends("cpu", torch.float32)
    print("available on cpu fp32:", avail, "bf16:", available_sdpa_backends("cpu", torch.bfloat16))
    assert "auto" in avail and "math" in avail
    assert set(avail) <= set(SDPA_BACKENDS)
    assert ("math", "cpu", torch.float32, 64, False, False) in attn_mod._PROBE_CACHE
    for name in SDPA_BACKENDS:  # consistent with check_sdpa_backend
        if name in avail:
            check_sdpa_backend(name, "cpu", torch.float32)
        else:
            with pytest.raises(UnsupportedBackendError):
                check_sdpa_backend(name, "cpu", torch.float32)


def test_unsupported_backend_message_names_device_and_working_backends():
    avail = available_sdpa_backends("cpu")
    missing = [n for n in SDPA_BACKENDS if n not in avail]
    if not missing:
        pytest.skip("every SDPA backend runs on this CPU build")
    with pytest.raises(UnsupportedBackendError) as info:
        check_sdpa_backend(missing[0], "cpu", torch.float32)
    msg = str(info.value)
    assert f"'{missing[0]}'" in msg and "'cpu'" in msg and "float32" in msg
    assert "Backends that work there: " + ", ".join(avail) in msg
    assert isinstance(info.value, ValueError)


def test_unusable_device_reports_no_working_backend():
    with pytest.raises(UnsupportedBackendError, match="device unusable.*Backends that work there: none"):
        check_sdpa_backend("math", "cuda:99")
    assert available_sdpa_backends("cuda:99") == []


def test_backend_parity_on_cpu_is_measured():
    """On CPU auto dispatches to flash (bit-equal) and math differs from flash by rounding (docs/measurements.md)."""
    avail = available_sdpa_backends("cpu")
    if "flash" not in avail:
        pytest.skip("flash SDPA not available on this CPU build")
    q, k, v = _qkv(seed=5)
    flash = _sdpa("flash", q, k, v)
    auto_flash = compare_outputs(flash, _sdpa("auto", q, k, v), label="sdpa auto vs flash fp32")
    math_flash = compare_outputs(flash, _sdpa("math", q, k, v), label="sdpa math vs flash fp32")
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    math_flash_bf16 = compare_outputs(
        _sdpa("flash", qb, kb, vb), _sdpa("math", qb, kb, vb), label="sdpa math vs flash bf16"
    )
    for rep in (auto_flash, math_flash, math_flash_bf16):
        print(rep.as_text())
    assert auto_flash.bit_equal, auto_flash.as_text()
    assert math_flash.max_abs < 1e-5
    assert math_flash_bf16.max_abs < 2e-2
    assert not compare_outputs(flash, _sdpa("flash", *_qkv(seed=6))).bit_equal  # output depends on the input


def test_fp8_is_probed_in_no_backend_but_its_compute_dtype_is():
    """Issue 24 item 2: no SDPA backend takes fp8 tensors, so probing the weight dtype of an fp8 model refuses every
    backend; the compute dtype (manual_cast_dtype, e.g. bf16) runs. The node probes the compute dtype."""
    clear_sdpa_backend_cache()
    assert available_sdpa_backends("cpu", torch.float8_e4m3fn) == []
    with pytest.raises(UnsupportedBackendError, match="float8_e4m3fn"):
        check_sdpa_backend("auto", "cpu", torch.float8_e4m3fn)
    check_sdpa_backend("auto", "cpu", torch.bfloat16)


def test_probe_cases_mask_and_determinism_are_separate_cache_entries():
    clear_sdpa_backend_cache()
    check_sdpa_backend("math", "cpu", torch.float32, mask=True, deterministic=True)
    assert ("math", "cpu", torch.float32, 64, True, True) in attn_mod._PROBE_CACHE
    assert ("math", "cpu", torch.float32, 64, False, False) not in attn_mod._PROBE_CACHE
    assert not torch.are_deterministic_algorithms_enabled()  # the probe restores the flag


def test_plan_lists_the_cases_a_backend_refuses(monkeypatch):
    """A backend that fails only with a mask / in fp32 (CUDA flash, sdp_utils.cpp) is planned with per-call
    fallbacks; one that fails the main case is refused up front. CPU kernels accept every case, so the CUDA
    refusals are emulated here by the probe's answers (the real ones: tests/comfy/test_gpu_correctness.py)."""
    real = attn_mod._probe

    def fake(name, device, dtype, head_dim, mask=False, deterministic=False):
        if name == "flash" and (mask or dtype == torch.float32):
            return "RuntimeError: No available kernel. Aborting execution."
        if name == "cudnn" and deterministic:
            return "RuntimeError: No available kernel. Aborting execution."
        return real("math", device, dtype, head_dim, mask, deterministic)

    monkeypatch.setattr(attn_mod, "_probe", fake)
    plan = attn_mod.plan_sdpa_backend("flash", "cpu", torch.bfloat16)
    assert plan.falls_back == (
        "torch.bfloat16 with an attention mask",
        "torch.float32",
        "torch.float32 with an attention mask",
    )
    assert "fall back to torch's own choice" in plan.as_text()
    assert attn_mod.plan_sdpa_backend("cudnn", "cpu", torch.bfloat16).falls_back == ()
    with pytest.raises(UnsupportedBackendError, match="under strict deterministic algorithms"):
        attn_mod.plan_sdpa_backend("cudnn", "cpu", torch.bfloat16, deterministic=True)


def test_run_pinned_falls_back_per_call_visibly():
    """A call torch has no kernel for under the pin runs on torch's own choice and is counted; the result equals
    an unpinned call. ``efficient`` has no CPU kernel, so every CPU call falls back."""
    q, k, v = _qkv(length=32)
    before = attn_mod.fallback_counts()
    out = attn_mod.run_pinned("efficient", F.scaled_dot_product_attention, q, k, v, why="test case")
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))
    assert attn_mod.fallbacks_since(before) == ["efficient -> auto: 1 calls (test case)"]
    before = attn_mod.fallback_counts()
    attn_mod.run_pinned("math", F.scaled_dot_product_attention, q, k, v, why="runs")
    assert attn_mod.fallbacks_since(before) == []
    with pytest.raises(RuntimeError, match="shape"):  # any other error is not swallowed
        attn_mod.run_pinned("efficient", lambda: (_ for _ in ()).throw(RuntimeError("bad shape")))
