"""SDPA backend pinning/probing and the ComfyUI-``attention_pytorch``-compatible ``sdpa_attention``."""
from __future__ import annotations

import math

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
    sdpa_attention,
    sdpa_context,
)
from steadfast.core.optimize.parity import compare_outputs, measure_parity


def _qkv(b=2, lq=12, lk=12, heads=4, dim_head=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = heads * dim_head
    return (torch.randn(b, lq, w, generator=g).to(dtype), torch.randn(b, lk, w, generator=g).to(dtype),
            torch.randn(b, lk, w, generator=g).to(dtype))


def _reference(q, k, v, heads, mask=None):
    """Plain softmax(QK^T/sqrt(d) + mask)V in float64, [B, L, H*D] in and out."""
    b, lq, w = q.shape
    d = w // heads
    q, k, v = (t.double().reshape(b, -1, heads, d).transpose(1, 2) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(b, lq, w)


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
    assert ("math", "cpu", torch.float32, 64) in attn_mod._PROBE_CACHE
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
    q, k, v = _qkv()
    with pytest.raises(UnsupportedBackendError, match="Backends that work there"):
        sdpa_attention(q, k, v, 4, backend=missing[0])


def test_unusable_device_reports_no_working_backend():
    with pytest.raises(UnsupportedBackendError, match="device unusable.*Backends that work there: none"):
        check_sdpa_backend("math", "cuda:99")
    assert available_sdpa_backends("cuda:99") == []


@pytest.mark.parametrize("backend", ["auto", "math"])
def test_sdpa_attention_matches_torch_sdpa_and_float64_reference(backend):
    heads = 4
    q, k, v = _qkv(lq=12, lk=7)  # cross-attention lengths
    out = sdpa_attention(q, k, v, heads, backend=backend)
    assert out.shape == q.shape and out.dtype == q.dtype
    split = lambda t: t.reshape(2, -1, heads, 16).transpose(1, 2)  # noqa: E731
    with sdpa_context(backend):
        ref = F.scaled_dot_product_attention(split(q), split(k), split(v)).transpose(1, 2).reshape(2, 12, 64)
    assert compare_outputs(ref, out).bit_equal
    assert torch.allclose(out.double(), _reference(q, k, v, heads), atol=1e-5)
    other = sdpa_attention(*_qkv(lq=12, lk=7, seed=1), heads, backend=backend)
    assert not compare_outputs(out, other).bit_equal


def test_skip_reshape_and_skip_output_reshape():
    heads = 4
    q, k, v = _qkv()
    flat = sdpa_attention(q, k, v, heads)
    split = [t.view(2, -1, heads, 16).transpose(1, 2) for t in (q, k, v)]
    pre = sdpa_attention(*split, heads, skip_reshape=True)
    assert compare_outputs(flat, pre).bit_equal
    raw = sdpa_attention(q, k, v, heads, skip_output_reshape=True)
    assert raw.shape == (2, heads, 12, 16)
    assert torch.equal(raw.transpose(1, 2).reshape(2, 12, 64), flat)


def test_masks_2d_and_3d_and_additive():
    heads = 4
    q, k, v = _qkv(lq=6, lk=5)
    mask2 = torch.ones(6, 5, dtype=torch.bool)
    mask2[:, -2:] = False
    out2 = sdpa_attention(q, k, v, heads, mask=mask2)
    assert torch.allclose(out2.double(), _reference(q, k, v, heads, mask2), atol=1e-5)
    # masked keys have no influence
    k2, v2 = k.clone(), v.clone()
    k2[:, -2:] += 5.0
    v2[:, -2:] -= 3.0
    assert torch.allclose(sdpa_attention(q, k2, v2, heads, mask=mask2), out2, atol=1e-6)
    mask3 = mask2.unsqueeze(0).expand(2, 6, 5)
    assert compare_outputs(sdpa_attention(q, k, v, heads, mask=mask3), out2).bit_equal
    additive = torch.zeros(6, 5).masked_fill(~mask2, float("-inf"))
    assert torch.allclose(sdpa_attention(q, k, v, heads, mask=additive), out2, atol=1e-6)


def test_works_as_comfyui_attention_override_and_on_noncontiguous_slices():
    heads = 4
    fused = torch.randn(2, 12, 3 * 64, generator=torch.Generator().manual_seed(4))
    q, k, v = fused.split(64, dim=-1)  # what fused_project returns
    assert not q.is_contiguous()

    def override(func, *args, **kwargs):  # ComfyUI calls override(func, q, k, v, heads, ...)
        return sdpa_attention(*args, backend="math", **kwargs)

    out = override(None, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False,
                   skip_output_reshape=False, transformer_options={}, _inside_attn_wrapper=True)
    ref = sdpa_attention(q.contiguous(), k.contiguous(), v.contiguous(), heads, backend="math")
    assert compare_outputs(ref, out).bit_equal


def test_heads_must_divide_width():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="not divisible by heads=5"):
        sdpa_attention(q, k, v, 5)


def test_backend_parity_on_cpu_is_measured():
    """Research (torch_probe §8): on CPU auto dispatches to flash (bit-equal) and math != flash bitwise."""
    avail = available_sdpa_backends("cpu")
    if "flash" not in avail:
        pytest.skip("flash SDPA not available on this CPU build")
    q, k, v = _qkv(b=1, lq=256, lk=256, heads=4, dim_head=64, seed=5)
    auto_flash = measure_parity(lambda *t: sdpa_attention(*t, 4), lambda *t: sdpa_attention(*t, 4, backend="flash"),
                                q, k, v, label="sdpa auto vs flash fp32")
    math_flash = measure_parity(lambda *t: sdpa_attention(*t, 4, backend="math"),
                                lambda *t: sdpa_attention(*t, 4, backend="flash"), q, k, v,
                                label="sdpa math vs flash fp32")
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    math_flash_bf16 = measure_parity(lambda *t: sdpa_attention(*t, 4, backend="math"),
                                     lambda *t: sdpa_attention(*t, 4, backend="flash"), qb, kb, vb,
                                     label="sdpa math vs flash bf16")
    for rep in (auto_flash, math_flash, math_flash_bf16):
        print(rep.as_text())
    assert auto_flash.bit_equal, auto_flash.as_text()
    assert math_flash.max_abs < 1e-5
    assert math_flash_bf16.max_abs < 2e-2
