"""ParityReport semantics: byte equality (dtype+shape+bits), magnitudes, nesting, and measure_parity plumbing."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from steadfast.core.optimize.parity import ParityReport, ParityStructureError, compare_outputs, measure_parity


def _t(seed=0, shape=(3, 4), dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_identical_outputs_are_bit_equal():
    a = _t()
    rep = compare_outputs(a, a.clone(), label="same")
    assert rep.bit_equal and rep.max_abs == 0.0 and rep.mean_abs == 0.0 and rep.n_differ == 0
    assert rep.numel == 12 and rep.n_tensors == 1
    assert rep.digest_baseline == rep.digest_optimized and len(rep.digest_baseline) == 64
    assert "bit-equal" in rep.as_text() and rep.as_text().startswith("same: ")
    assert rep.baseline_s is None


def test_one_ulp_difference_is_counted_with_magnitude():
    a = _t()
    b = a.clone()
    b[1, 2] = torch.nextafter(b[1, 2], torch.tensor(float("inf")))
    d = float((b[1, 2].double() - a[1, 2].double()).abs())
    rep = compare_outputs(a, b)
    assert not rep.bit_equal and rep.n_differ == 1
    assert rep.max_abs == pytest.approx(d) and rep.mean_abs == pytest.approx(d / 12)
    assert rep.digest_baseline != rep.digest_optimized
    assert "NOT bit-equal, 1/12 differ" in rep.as_text()


def test_signed_zero_differs_but_equal_nan_bits_match():
    z = compare_outputs(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]))
    assert torch.equal(torch.tensor([0.0]), torch.tensor([-0.0]))  # torch.equal would miss it
    assert not z.bit_equal and z.n_differ == 1 and z.max_abs == 0.0
    n = torch.tensor([float("nan"), 2.0])
    rep = compare_outputs(n, n.clone())
    assert rep.bit_equal and rep.max_abs == 0.0
    vs_number = compare_outputs(n, torch.tensor([1.0, 2.0]))
    assert not vs_number.bit_equal and vs_number.max_abs != vs_number.max_abs  # nan reported, not hidden


def test_dtype_and_layout():
    a = _t()
    as64 = compare_outputs(a, a.double())
    assert not as64.bit_equal and as64.max_abs == 0.0 and as64.n_differ == 0  # same values, other dtype
    bf = _t(dtype=torch.bfloat16)
    bf2 = bf.clone()
    bf2[0, 0] = -bf2[0, 0]
    rep = compare_outputs(bf, bf2)
    assert rep.n_differ == 1 and rep.max_abs == pytest.approx(2 * abs(float(bf[0, 0])))
    x = torch.randn(1, 3, 4, 4)
    assert compare_outputs(x, x.contiguous(memory_format=torch.channels_last)).bit_equal  # bytes in C order
    assert compare_outputs(torch.tensor([True, False]), torch.tensor([True, True])).n_differ == 1


def test_nested_outputs():
    a, b = _t(0), _t(1)
    rep = compare_outputs((a, {"x": b, "n": 3}), (a.clone(), {"x": b.clone(), "n": 3}))
    assert rep.bit_equal and rep.n_tensors == 2 and rep.numel == 24
    b2 = b.clone()
    b2[0, 0] += 1.0
    rep = compare_outputs([a, b], [a, b2])
    assert not rep.bit_equal and rep.n_differ == 1 and rep.max_abs == pytest.approx(1.0, rel=1e-6)
    assert not compare_outputs((a, 3), (a, 4)).bit_equal


def test_structure_and_shape_mismatch_raise():
    a = _t()
    with pytest.raises(ParityStructureError, match=r"shapes differ: \(3, 4\).*\(4, 3\)"):
        compare_outputs(a, a.T.contiguous())
    with pytest.raises(ParityStructureError, match="structures differ"):
        compare_outputs((a, a), (a,))
    with pytest.raises(ParityStructureError, match="structures differ"):
        compare_outputs({"a": a}, {"b": a})
    with pytest.raises(ParityStructureError, match="tensor vs"):
        compare_outputs(a, 3)
    assert issubclass(ParityStructureError, ValueError)


def test_measure_parity_runs_both_under_inference_mode_and_passes_arguments():
    seen = []

    def f(x, *, scale):
        seen.append(torch.is_inference_mode_enabled())
        return x * scale

    x = _t()
    rep = measure_parity(f, f, x, scale=2.0, label="scale")
    assert seen == [True, True]
    assert isinstance(rep, ParityReport) and rep.bit_equal and rep.label == "scale"
    assert rep.baseline_s is not None and rep.baseline_s >= 0 and rep.optimized_s >= 0
    assert "ms" in rep.as_text()
    d = rep.as_dict()
    assert json.loads(json.dumps(d))["bit_equal"] is True
    assert set(d) >= {"bit_equal", "max_abs", "mean_abs", "n_differ", "numel", "label"}


def test_measure_parity_on_a_real_model_reports_a_reordered_reduction():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 8)).requires_grad_(False)
    x = torch.randn(4, 256)

    def reordered(t):  # same math, different summation order in the first layer
        w, b = model[0].weight, model[0].bias
        h = (t[:, :128] @ w[:, :128].T + t[:, 128:] @ w[:, 128:].T) + b
        return model[2](model[1](h))

    same = measure_parity(model, model, x)
    rep = measure_parity(model, reordered, x, label="split-K")
    print(rep.as_text())
    assert same.bit_equal
    assert rep.max_abs < 1e-4  # float rounding only; equality is reported, not assumed
    other = measure_parity(model, model, torch.randn(4, 256))
    assert other.digest_baseline != same.digest_baseline  # output depends on input
