"""Zero-copy QKV fusion: storage sharing, state_dict invariance, liveness, fallbacks and measured parity.

The attention modules below mimic ComfyUI's ``CrossAttention`` (to_q/to_k/to_v Linears + heads +
to_out) without importing ComfyUI.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from steadfast.core.optimize.qkv import (
    FusedQKV,
    NotFusableError,
    find_fusable_attention,
    fuse_all_qkv_,
    fuse_qkv_,
    is_fused,
    qkv_stats,
    release_stale_fusions_,
    unfuse_all_qkv_,
    unfuse_qkv_,
)
from steadfast.core.optimize.qkv_project import fused_project
from steadfast.core.record.compare import compare_outputs
from steadfast.core.record.hashing import tensor_digest


class Attn(nn.Module):
    """ComfyUI-CrossAttention-shaped module; ``fused=True`` projects through :func:`fused_project`."""

    def __init__(
        self,
        query_dim: int,
        context_dim: int | None = None,
        heads: int = 4,
        dim_head: int = 16,
        bias: bool = False,
        linear: type[nn.Linear] = nn.Linear,
    ) -> None:
        super().__init__()
        inner = heads * dim_head
        context_dim = context_dim or query_dim
        self.heads = heads
        self.to_q = linear(query_dim, inner, bias=bias)
        self.to_k = linear(context_dim, inner, bias=bias)
        self.to_v = linear(context_dim, inner, bias=bias)
        self.to_out = nn.Sequential(nn.Linear(inner, query_dim), nn.Dropout(0.0))
        self.requires_grad_(False)  # as ComfyUI loads models

    def forward(self, x, context=None, value=None, mask=None, fused=False):
        if fused:
            q, k, v = fused_project(self, x, context, value)
        else:
            ctx = x if context is None else context
            q, k, v = self.to_q(x), self.to_k(ctx), self.to_v(ctx if value is None else value)
        split = [t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v)]  # [B, heads, L, dim_head]
        out = F.scaled_dot_product_attention(*split, attn_mask=mask)
        return self.to_out(out.transpose(1, 2).flatten(-2))


class Block(nn.Module):
    def __init__(self, dim: int = 64, context_dim: int = 48) -> None:
        super().__init__()
        self.attn1 = Attn(dim)
        self.attn2 = Attn(dim, context_dim)
        self.ff = nn.Linear(dim, dim)

    def forward(self, x, context, fused=False):
        x = x + self.attn1(x, fused=fused)
        x = x + self.attn2(x, context, fused=fused)
        return self.ff(x)


class CastingLinear(nn.Linear):
    """Mimics a comfy.ops Linear: casts its weight to the input dtype at forward time."""

    comfy_cast_weights = False

    def forward(self, x):
        b = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), b)


def _storage_bytes(*modules: nn.Module, extra=()) -> int:
    """Bytes of the distinct storages behind all parameters (and ``extra`` tensors)."""
    seen: dict[int, int] = {}
    for m in modules:
        for p in m.parameters():
            s = p.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    for t in extra:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _sd_digests(m: nn.Module) -> dict[str, str]:
    return {k: tensor_digest(v) for k, v in m.state_dict().items()}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_find_fusable_attention_finds_self_and_cross_attention():
    blk = Block()
    blk.odd = nn.Module()  # k/v in_features differ -> not fusable
    blk.odd.to_q, blk.odd.to_k, blk.odd.to_v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(4, 8)
    blk.subclassed = Attn(32, linear=CastingLinear)  # Linear subclasses (comfy.ops style) count
    names = [n for n, _ in find_fusable_attention(blk)]
    assert names == ["attn1", "attn2", "subclassed"]
    assert find_fusable_attention(blk.attn1)[0][0] == ""  # root itself included
    assert find_fusable_attention(nn.Linear(4, 4)) == []


@pytest.mark.parametrize("bias", [False, True])
def test_self_attention_fusion_shares_one_storage_and_costs_no_memory(bias):
    attn = Attn(64, bias=bias)
    params_before = {n: p for n, p in attn.named_parameters()}
    sd_before = _sd_digests(attn)
    bytes_before = _storage_bytes(attn)
    n_storages_before = len({_ptr(p) for p in attn.parameters()})

    rec = fuse_qkv_(attn)

    assert isinstance(rec, FusedQKV) and rec.kind == "qkv" and rec.splits == (64, 64, 64)
    assert tuple(rec.weight.shape) == (192, 64)
    fused_ptr = _ptr(rec.weight)
    for name in ("to_q", "to_k", "to_v"):
        lin = getattr(attn, name)
        assert _ptr(lin.weight) == fused_ptr
        if bias:
            assert _ptr(lin.bias) == _ptr(rec.bias)
    # offsets place q, k, v one after another inside the fused weight
    assert [getattr(attn, n).weight.storage_offset() for n in ("to_q", "to_k", "to_v")] == [0, 64 * 64, 2 * 64 * 64]
    # zero extra memory: distinct storages (params + the private fused tensors) add up to the same bytes
    assert _storage_bytes(attn, extra=[t for t in (rec.weight, rec.bias) if t is not None]) == bytes_before
    assert len({_ptr(p) for p in attn.parameters()}) == n_storages_before - (4 if bias else 2)
    assert rec.nbytes == sum(getattr(attn, n).weight.nbytes for n in ("to_q", "to_k", "to_v")) + (
        sum(getattr(attn, n).bias.nbytes for n in ("to_q", "to_k", "to_v")) if bias else 0
    )
    # Parameter objects, state_dict keys and values unchanged; fused tensors are not params/buffers
    assert {n: p for n, p in attn.named_parameters()}.keys() == params_before.keys()
    assert all(p is params_before[n] for n, p in attn.named_parameters())
    assert _sd_digests(attn) == sd_before
    assert list(attn.buffers()) == []
    assert is_fused(attn)


def test_cross_attention_fuses_only_k_and_v():
    attn = Attn(64, context_dim=48)
    q_ptr = _ptr(attn.to_q.weight)
    sd_before = _sd_digests(attn)
    rec = fuse_qkv_(attn)
    assert rec.kind == "kv" and rec.names == ("to_k", "to_v") and tuple(rec.weight.shape) == (128, 48)
    assert _ptr(attn.to_q.weight) == q_ptr  # q untouched
    assert _ptr(attn.to_k.weight) == _ptr(attn.to_v.weight) == _ptr(rec.weight)
    assert _sd_digests(attn) == sd_before
    with pytest.raises(NotFusableError, match="in_features differ"):
        fuse_qkv_(Attn(64, context_dim=48), self_attention=True)


def test_fusion_is_idempotent_and_kind_can_be_forced():
    attn = Attn(32)
    rec = fuse_qkv_(attn)
    ptr = _ptr(attn.to_q.weight)
    assert fuse_qkv_(attn) is rec and _ptr(attn.to_q.weight) == ptr
    values = attn.to_k.weight.detach().clone()
    rec_kv = fuse_qkv_(attn, self_attention=False)  # self-attention-shaped, fuse k/v only
    assert rec_kv.kind == "kv" and is_fused(attn)
    assert _ptr(attn.to_q.weight) != _ptr(attn.to_k.weight)
    assert torch.equal(attn.to_k.weight, values)


def test_fused_project_paths_are_bit_equal_in_fp32_and_counted():
    attn = Attn(64, bias=True)
    x, ctx = torch.randn(2, 10, 64), torch.randn(2, 7, 64)
    with torch.inference_mode():
        ref_self = fused_project(attn, x)  # not fused yet -> separate
        ref_ctx = fused_project(attn, x, ctx)
    st = qkv_stats(attn)
    assert (st.unfused_calls, st.last_path, st.last_reason) == (2, "separate", "not fused")

    fuse_qkv_(attn)
    with torch.inference_mode():
        got_self = fused_project(attn, x)
        assert st.last_path == "qkv"
        got_ctx = fused_project(attn, x, ctx)
        assert st.last_path == "kv"
        got_val = fused_project(attn, x, ctx, value=ctx)
        assert st.last_path == "separate" and "value" in st.last_reason
    assert (st.fused_calls, st.kv_fused_calls, st.unfused_calls) == (1, 1, 3)
    assert fuse_qkv_(attn).stats is st
    # fp32 on CPU: fusion is bit-equal
    assert compare_outputs(ref_self, got_self).bit_equal
    assert compare_outputs(ref_ctx, got_ctx).bit_equal
    assert compare_outputs(ref_ctx, got_val).bit_equal
    assert not got_self[0].is_contiguous()  # slices of one matmul result, like diffusers


def test_cross_attention_kv_path():
    attn = Attn(64, context_dim=48)
    x, ctx = torch.randn(1, 9, 64), torch.randn(1, 5, 48)
    ref = fused_project(attn, x, ctx)
    fuse_qkv_(attn)
    got = fused_project(attn, x, ctx)
    assert qkv_stats(attn).last_path == "kv"
    assert compare_outputs(ref, got).bit_equal


def test_whole_module_parity_fp32_is_bit_equal_and_depends_on_input():
    blk = Block()
    x, ctx = torch.randn(2, 16, 64), torch.randn(2, 8, 48)
    with torch.inference_mode():
        ref = blk(x, ctx)
        assert compare_outputs(ref, blk(x, ctx)).bit_equal  # run-to-run
        fuse_all_qkv_(blk)
        rep = compare_outputs(ref, blk(x, ctx, fused=True), label="fused-qkv fp32")
    print(rep.as_text())
    assert rep.bit_equal, rep.as_text()
    assert qkv_stats(blk.attn1).fused_calls == 1 and qkv_stats(blk.attn2).kv_fused_calls == 1
    with torch.inference_mode():
        other = blk(torch.randn(2, 16, 64), ctx, fused=True)
    assert not compare_outputs(ref, other).bit_equal  # output depends on the input


def test_module_to_other_dtype_breaks_fusion_detectably_and_refuse_works():
    attn = Attn(32, bias=True)
    fuse_qkv_(attn)
    attn.to(torch.float64)
    assert not is_fused(attn)
    x = torch.randn(1, 4, 32, dtype=torch.float64)
    q, k, v = fused_project(attn, x)
    st = qkv_stats(attn)
    assert st.last_path == "separate" and "no longer live" in st.last_reason
    assert torch.equal(q, attn.to_q(x))
    assert "_steadfast_fused_qkv" not in attn.__dict__  # stale fused storage released
    rec = fuse_qkv_(attn)
    assert is_fused(attn) and rec.weight.dtype == torch.float64
    fused_project(attn, x)
    assert st.last_path == "qkv"


def test_replacing_a_parameter_breaks_fusion_detectably():
    attn = Attn(32)
    fuse_qkv_(attn)
    attn.to_v.weight = nn.Parameter(attn.to_v.weight.detach().clone())  # e.g. comfy.utils.set_attr_param
    assert not is_fused(attn)
    assert not unfuse_qkv_(attn)  # nothing live to undo; record removed
    assert not is_fused(attn)


def test_in_place_weight_update_keeps_fusion_live():
    attn = Attn(32)
    fuse_qkv_(attn)
    with torch.no_grad():
        attn.to_k.weight.data.copy_(torch.randn(64, 32))  # ComfyUI weight_inplace_update style
    assert is_fused(attn)
    x = torch.randn(1, 6, 32)
    q, k, v = fused_project(attn, x)
    assert qkv_stats(attn).last_path == "qkv"
    assert torch.equal(k, attn.to_k(x))


def test_unfuse_restores_separate_storages_bit_exactly():
    attn = Attn(48, bias=True)
    sd_before = _sd_digests(attn)
    bytes_before = _storage_bytes(attn)
    fuse_qkv_(attn)
    assert unfuse_qkv_(attn)
    ptrs = {_ptr(getattr(attn, n).weight) for n in ("to_q", "to_k", "to_v")}
    assert len(ptrs) == 3
    assert not is_fused(attn)
    assert _sd_digests(attn) == sd_before
    assert _storage_bytes(attn) == bytes_before
    assert not unfuse_qkv_(attn)
    x = torch.randn(1, 3, 48)
    fused_project(attn, x)
    assert qkv_stats(attn).last_reason == "not fused"


def test_fuse_all_and_unfuse_all():
    blk = Block()
    recs = fuse_all_qkv_(blk)
    assert {n: r.kind for n, r in recs.items()} == {"attn1": "qkv", "attn2": "kv"}
    assert unfuse_all_qkv_(blk) == 2
    assert not is_fused(blk.attn1) and not is_fused(blk.attn2)


def test_fallbacks_for_dtype_mismatch_hooks_and_forward_time_casting():
    attn = Attn(32, linear=CastingLinear)
    fuse_qkv_(attn)
    st = qkv_stats(attn)
    x64 = torch.randn(1, 5, 32, dtype=torch.float64)
    q, _, _ = fused_project(attn, x64)
    assert st.last_path == "separate" and "float64" in st.last_reason
    assert torch.equal(q, attn.to_q(x64))

    x = torch.randn(1, 5, 32)
    attn.to_k.comfy_cast_weights = True
    fused_project(attn, x)
    assert st.last_path == "separate" and "casts" in st.last_reason
    attn.to_k.comfy_cast_weights = False

    calls = []
    handle = attn.to_v.register_forward_hook(lambda m, i, o: calls.append(1))
    fused_project(attn, x)
    assert st.last_path == "separate" and "hook" in st.last_reason and calls == [1]
    handle.remove()
    fused_project(attn, x)
    assert st.last_path == "qkv"


def test_not_fusable_cases_raise():
    tied = Attn(16)
    tied.to_v.weight = tied.to_k.weight
    with pytest.raises(NotFusableError, match="share a Parameter"):
        fuse_qkv_(tied)
    mixed = Attn(16)
    mixed.to_v = nn.Linear(16, 64, bias=True)
    with pytest.raises(NotFusableError, match="bias"):
        fuse_qkv_(mixed)
    with pytest.raises(NotFusableError, match="to_q"):
        fuse_qkv_(nn.Linear(4, 4))
    assert isinstance(NotFusableError("x"), ValueError)


def test_fusing_under_inference_mode_keeps_normal_parameters_and_grads_fall_back():
    attn = Attn(32).requires_grad_(True)
    with torch.inference_mode():
        fuse_qkv_(attn)
    assert is_fused(attn) and not attn.to_q.weight.is_inference()
    assert attn.to_q.weight.requires_grad
    x = torch.randn(1, 4, 32)
    q, k, v = fused_project(attn, x)  # grad mode + trainable weights -> separate, so grads are right
    st = qkv_stats(attn)
    assert st.last_path == "separate" and "grad" in st.last_reason
    (q.sum() + k.sum() + v.sum()).backward()
    assert all(getattr(attn, n).weight.grad is not None for n in ("to_q", "to_k", "to_v"))
    with torch.no_grad():
        fused_project(attn, x)
    assert st.last_path == "qkv"


def test_bf16_parity_at_k1280_is_measured_not_assumed():
    """bf16 fused != unfused at in_features 1280 on CPU (one-ulp differences, hardware-dependent). Report, bound."""
    k_in, tokens = 1280, 1024
    attn = Attn(k_in, heads=20, dim_head=64).to(torch.bfloat16)
    x = torch.randn(1, tokens, k_in, dtype=torch.bfloat16)
    with torch.inference_mode():
        ref = fused_project(attn, x)
    fuse_qkv_(attn)
    with torch.inference_mode():
        rep = compare_outputs(ref, fused_project(attn, x), label="fused-qkv bf16 K=1280")
    print(rep.as_text())
    assert qkv_stats(attn).last_path == "qkv"
    assert rep.numel == 3 * tokens * k_in
    out_max = max(float(t.float().abs().max()) for t in ref)
    assert rep.max_abs <= out_max * 2.0**-7  # at most ~one bf16 ulp at the largest magnitude
    assert rep.n_differ <= rep.numel * 1e-3


def test_refusing_params_replaced_under_inference_mode():
    attn = Attn(32)
    with torch.inference_mode():
        attn.to_k.weight = nn.Parameter(torch.randn(64, 32), requires_grad=False)  # an inference tensor
        fuse_qkv_(attn)
    assert is_fused(attn)
    x = torch.randn(1, 3, 32)
    with torch.no_grad():
        q, k, v = fused_project(attn, x)  # usable outside inference_mode
        assert torch.equal(k, attn.to_k(x))


def test_release_stale_fusions():
    blk = Block()
    fuse_all_qkv_(blk)
    blk.attn2.to_k.weight = nn.Parameter(blk.attn2.to_k.weight.detach().clone(), requires_grad=False)
    assert release_stale_fusions_(blk) == 1
    assert is_fused(blk.attn1) and "_steadfast_fused_qkv" not in blk.attn2.__dict__
    assert release_stale_fusions_(blk) == 0


def test_compiled_fused_project_is_one_graph_and_needs_eager_stale_release():
    """Inside torch.compile the liveness check and counters are skipped (not traceable); documented."""
    from torch._dynamo.utils import counters

    attn = Attn(64)
    fuse_qkv_(attn)
    x = torch.randn(1, 8, 64)
    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(lambda t: fused_project(attn, t), backend="eager", fullgraph=True)
    with torch.inference_mode():
        eager = fused_project(attn, x)
        st = qkv_stats(attn)
        before = st.as_dict()
        got = fn(x)
        fn(x)
        assert counters["stats"]["unique_graphs"] == 1
        assert st.as_dict() == before  # compiled calls are not counted
        assert compare_outputs(eager, got).bit_equal
        attn.to_k.weight = nn.Parameter(torch.randn(64, 64), requires_grad=False)
        assert release_stale_fusions_(attn) == 1
        after = fn(x)  # record gone -> Dynamo retraces onto the separate path
        assert torch.equal(after[1], attn.to_k(x))
    torch._dynamo.reset()
