"""core.optimize.quantize on small real modules: which Linears, int8 vs fp32 measured, copies rebuilt on change.

Skipped (loudly) when torchao is not installed; the "pip install torchao" error is tested without it.
"""

from __future__ import annotations

import builtins

import pytest
import torch
from torch import nn

from steadfast.core.optimize import quantize as qz
from steadfast.core.record import explain

torchao = pytest.importorskip("torchao", reason="torchao not installed (pip install torchao)")


class MLPBlock(nn.Module):
    """[B, N, 128] -> [B, N, 128]: LayerNorm -> Linear(128, 512) -> GELU -> Linear(512, 128), plus two Linears
    that must be skipped (8 output features; 100 input features, not a multiple of 16)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(128)
        self.up = nn.Linear(128, 512)
        self.down = nn.Linear(512, 128)
        self.gate = nn.Linear(128, 8)
        self.odd = nn.Linear(100, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(nn.functional.gelu(self.up(self.norm(x))))
        return x + h + self.gate(x).mean(-1, keepdim=True) + self.odd(x[..., :100])


def quantized(model: nn.Module, mode: str = "int8-dynamic") -> tuple[nn.Module, qz.Choice]:
    return model, qz.quantize_in_place(model, mode)


@pytest.fixture
def pair(one_thread):
    torch.manual_seed(0)
    ref = MLPBlock().eval()
    q = MLPBlock().eval()
    q.load_state_dict(ref.state_dict())
    q, choice = quantized(q)
    return ref, q, choice


def test_choice_counts_and_skips(pair) -> None:
    _, _, choice = pair
    assert choice.paths == ("up", "down")
    assert choice.skipped == {"smaller than 64 features": 1, "features not multiples of 16": 1}
    assert choice.as_text() == (
        "2 Linear layers (skipped: 1 features not multiples of 16, 1 smaller than 64 features)"
    )


def test_int8_differs_by_a_measured_bounded_amount(pair) -> None:
    ref, q, _ = pair
    x = torch.randn(2, 16, 128, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = ref(x), q(x)
        b2 = q(x)
        other = q(x * 2)
    assert type(q.up.quantized.weight).__name__ == "Int8Tensor"  # torchao's int8 weight, not a dense copy
    assert not torch.equal(a, b)  # quantization changes the bits
    assert torch.equal(b, b2)  # run-to-run identical
    assert not torch.equal(b, other)  # the output depends on the input
    err = (a - b).abs().max().item()
    # measured: 0.0095 (int8 per-row weights, per-token activations, fp32 accumulation on CPU)
    assert 1e-4 < err < 0.05, err
    assert err / a.abs().max().item() < 0.01


def test_state_dict_unchanged_and_source_untouched(pair) -> None:
    ref, q, _ = pair
    assert list(q.state_dict()) == list(ref.state_dict())
    assert all(torch.equal(q.state_dict()[k], v) for k, v in ref.state_dict().items())
    assert q.up.weight is q.up.source.weight and type(q.up.source.weight) is nn.Parameter


def test_rebuilt_only_when_the_weight_changes(pair) -> None:
    _, q, _ = pair
    x = torch.randn(1, 4, 128, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = q(x)
        assert q.up.refresh_() is False and q.up.builds == 1
        q.up.weight.add_(0.05)  # an in-place patch (ComfyUI's LoRA with weight_inplace_update)
        assert q.up.refresh_() is True and q.up.builds == 2
        changed = q(x)
        q.up.weight = nn.Parameter(q.up.weight - 0.05, requires_grad=False)  # a replaced Parameter
        assert q.up.refresh_() is True
        back = q(x)
    assert not torch.equal(before, changed)
    assert (before - back).abs().max().item() < 1e-3  # same values re-quantized (sub may round in fp32)
    q.up.release_()
    with pytest.raises(RuntimeError, match="before refresh_"):
        q.up(x)
    assert q.up.refresh_() is True


def test_fp8_refused_without_a_capable_gpu() -> None:
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= qz.FP8_MIN_CAPABILITY:
        pytest.skip("this machine has an fp8-capable GPU")
    with pytest.raises(qz.QuantizeUnavailable, match=r"compute capability >= 8\.9"):
        qz.check_supported("fp8-dynamic", "cpu")
    qz.check_supported("int8-dynamic", "cpu")
    qz.check_supported("off", "cpu")
    with pytest.raises(ValueError, match="unknown mode"):
        qz.check_supported("int4", "cpu")


def test_missing_torchao_says_pip_install(monkeypatch) -> None:
    real_import = builtins.__import__

    def no_torchao(name, *args, **kwargs):
        if name.startswith("torchao"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    monkeypatch.setattr(qz.importlib, "import_module", lambda name: no_torchao(name))
    with pytest.raises(qz.QuantizeUnavailable, match="pip install torchao"):
        qz.require_torchao()


def test_explain_names_quantize_as_expected_to_differ() -> None:
    base = {"fingerprint": {"torch": "2.14.1"}}
    quant = {"fingerprint": {"torch": "2.14.1", "quantize": {"mode": "int8-dynamic", "layers": 2}}}
    expected, text = explain.expected_difference(base, quant)
    assert expected is True and "fingerprint.quantize." in text and "quantized" in text


def test_expected_difference_names_each_reason_once() -> None:
    """Many fields of one setting (QKV fusion counters) cannot push quantize out of the six named reasons."""
    base = {"details": {}, "fingerprint": {"attention": "a"}}
    now = {
        "details": {"qkv_fusion": {f"c{i}": i for i in range(8)}},
        "fingerprint": {"attention": "b", "quantize": {"mode": "int8-dynamic"}},
    }
    expected, text = explain.expected_difference(base, now)
    assert expected is True and text.count("optimization changes the kernels") == 1
    assert "fingerprint.attention" in text and "fingerprint.quantize." in text


def test_source_and_wrapper_always_hold_the_same_parameters() -> None:
    """ComfyUI assigns patched weights to whichever module is in the tree: through the wrapper (mirrored to the
    source) or, while another copy of the model runs unquantized, to the source (adopted at the next refresh)."""
    torch.manual_seed(3)
    lin = nn.Linear(64, 64)
    q = qz.QuantizedLinear(lin, "int8-dynamic")
    q.refresh_()
    through_wrapper = nn.Parameter(lin.weight.detach() + 0.1, requires_grad=False)
    q.weight = through_wrapper
    assert lin.weight is through_wrapper and q.refresh_() is True
    on_source = nn.Parameter(lin.weight.detach() * 2, requires_grad=False)
    lin.weight = on_source
    assert q.refresh_() is True and q.weight is on_source
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert ((q(x) - lin(x)).abs().max() / lin(x).abs().max()).item() < 0.02  # quantized from the new weight
