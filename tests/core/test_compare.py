"""compare() / compare_outputs(): bytes decide identity; differences are measured, located and reported."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from steadfast.core.record.compare import CompareShapeError, compare, compare_outputs, diff_heatmap


def _image(seed=0, shape=(2, 8, 8, 3)):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def test_identical_images():
    a = _image()
    r = compare(a, a.clone(), kind="image")
    assert r.identical is True
    assert r.max_abs == 0.0 and r.mean_abs == 0.0
    assert r.pct_values_differ == 0.0 and r.pct_pixels_differ == 0.0 and r.n_values_differ == 0
    assert r.psnr == math.inf
    assert r.shape == (2, 8, 8, 3) and r.dtype == "torch.float32"
    assert "IDENTICAL" in r.as_text()
    d = r.as_dict()
    assert d["psnr"] == "inf" and d["identical"] is True
    json.dumps(d, allow_nan=False)


def test_identical_regardless_of_layout():
    lat = torch.randn(1, 4, 8, 8)
    assert compare(lat, lat.to(memory_format=torch.channels_last), kind="latent").identical


def test_one_pixel_change_in_image():
    a = _image()
    b = a.clone()
    b[1, 3, 5, 2] = a[1, 3, 5, 2] + 0.1 if a[1, 3, 5, 2] < 0.9 else a[1, 3, 5, 2] - 0.1
    r = compare(a, b, kind="image")
    delta = abs(float(b[1, 3, 5, 2].double() - a[1, 3, 5, 2].double()))
    assert r.identical is False and r.n_values_differ == 1
    assert r.pct_values_differ == pytest.approx(100 / a.numel())
    assert r.pct_pixels_differ == pytest.approx(100 / (2 * 8 * 8))
    assert r.max_abs == pytest.approx(delta, rel=1e-12)
    assert r.mean_abs == pytest.approx(delta / a.numel(), rel=1e-12)
    assert r.psnr == pytest.approx(10 * math.log10(1 / (delta**2 / a.numel())), rel=1e-9)
    assert "DIFFERENT" in r.as_text() and "pixels differ" in r.as_text()


def test_tiny_change_detected_even_below_uint8_resolution():
    a = _image()
    b = a.clone()
    b.view(torch.int32)[0, 0, 0, 0] ^= 1  # one ulp
    r = compare(a, b, kind="image")
    assert not r.identical and r.n_values_differ == 1 and 0 < r.max_abs < 1e-6


def test_latent_pixels_are_counted_over_channels():
    a = torch.randn(2, 4, 8, 8)
    b = a.clone()
    b[0, :, 2, 3] += 1.0  # all 4 channels of one spatial position
    r = compare(a, b, kind="latent")
    assert r.n_values_differ == 4
    assert r.pct_pixels_differ == pytest.approx(100 / (2 * 8 * 8))
    assert r.max_abs == pytest.approx(1.0, abs=1e-6)
    assert r.psnr_peak == pytest.approx(float(a.abs().max()))


def test_video_latent_5d():
    a = torch.randn(1, 16, 3, 4, 4)
    b = a.clone()
    b[0, 5, 1, 2, 2] -= 0.5
    r = compare(a, b, kind="latent")
    assert r.pct_pixels_differ == pytest.approx(100 / (3 * 4 * 4))
    heat = diff_heatmap(a, b, kind="latent")
    assert heat.shape == (3, 4, 4, 3)  # frames stacked in the batch
    nonzero = (heat.sum(-1) > 0).nonzero().tolist()
    assert nonzero == [[1, 2, 2]]


@pytest.mark.parametrize("b_shape, b_dtype", [((2, 8, 8, 4), torch.float32), ((2, 8, 8, 3), torch.float16)])
def test_mismatch_raises_with_both_shapes(b_shape, b_dtype):
    a = _image()
    b = torch.zeros(b_shape, dtype=b_dtype)
    with pytest.raises(CompareShapeError) as info:
        compare(a, b, kind="image")
    assert isinstance(info.value, ValueError)
    assert str((2, 8, 8, 3)) in str(info.value) and str(b_shape) in str(info.value)
    with pytest.raises(CompareShapeError):
        diff_heatmap(a, b, kind="image")


def test_bad_kind_and_rank():
    a = torch.zeros(1, 4, 4, 3)
    with pytest.raises(ValueError):
        compare(a, a, kind="video")
    with pytest.raises(ValueError):
        compare(torch.zeros(4, 4, 3), torch.zeros(4, 4, 3), kind="image")
    with pytest.raises(ValueError):
        diff_heatmap(torch.zeros(1, 4, 4), torch.zeros(1, 4, 4), kind="latent")


def test_negative_zero_differs_by_bytes_with_zero_magnitude():
    a = torch.zeros(1, 2, 2, 3)
    b = a.clone()
    b[0, 0, 0, 0] = -0.0
    r = compare(a, b, kind="image")
    assert r.identical is False and r.n_values_differ == 1
    assert r.max_abs == 0.0 and r.psnr == math.inf


def test_nan_handling():
    a = torch.rand(1, 2, 2, 3)
    a[0, 0, 0, 0] = float("nan")
    assert compare(a, a.clone(), kind="image").identical  # same NaN bytes -> identical
    b = a.clone()
    b[0, 0, 0, 0] = 0.25  # NaN vs number
    b[0, 1, 1, 1] += 0.5
    r = compare(a, b, kind="image")
    assert not r.identical and r.n_values_differ == 2 and r.n_nan_diff == 1
    assert r.max_abs == pytest.approx(0.5, abs=1e-6)  # NaN position excluded from |d| stats
    assert math.isfinite(r.psnr)
    heat = diff_heatmap(a, b, kind="image", normalize=True)
    assert torch.equal(heat[0, 0, 0], torch.tensor([1.0, 1.0, 0.0]))  # NaN diff drawn at full intensity


def test_heatmap_identical_is_all_zeros():
    a = _image()
    heat = diff_heatmap(a, a.clone(), kind="image")
    assert heat.shape == (2, 8, 8, 3) and heat.dtype == torch.float32
    assert not heat.any()
    lat = torch.randn(2, 4, 8, 8)
    assert not diff_heatmap(lat, lat.clone(), kind="latent").any()


def test_heatmap_shape_range_and_colours():
    a = torch.randn(2, 4, 8, 8)
    b = a + 0.01 * torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    heat = diff_heatmap(a, b, kind="latent")
    assert heat.shape == (2, 8, 8, 3) and heat.dtype == torch.float32
    assert float(heat.min()) >= 0.0 and float(heat.max()) <= 1.0
    assert torch.equal(heat[..., 2], torch.zeros(2, 8, 8))  # black -> red -> yellow: no blue
    # the normalised maximum is yellow
    per_pixel = (a.double() - b.double()).abs().mean(1)
    idx = divmod(int(per_pixel.argmax()), 64)
    bi, rest = idx
    assert torch.allclose(heat[bi, rest // 8, rest % 8], torch.tensor([1.0, 1.0, 0.0]))


def test_heatmap_image_absolute_scale_and_location():
    a = torch.zeros(1, 4, 4, 3)
    b = a.clone()
    b[0, 2, 1, :] = 0.25  # mean |d| 0.25 -> red at half brightness
    heat = diff_heatmap(a, b, kind="image")
    assert torch.allclose(heat[0, 2, 1], torch.tensor([0.5, 0.0, 0.0]))
    assert int((heat.sum(-1) > 0).sum()) == 1
    heat_n = diff_heatmap(a, b, kind="image", normalize=True)
    assert torch.allclose(heat_n[0, 2, 1], torch.tensor([1.0, 1.0, 0.0]))


# --------------------------------------------------------------------------- compare_outputs
def _t(seed=0, shape=(3, 4), dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_identical_outputs_are_bit_equal():
    a = _t()
    rep = compare_outputs(a, a.clone(), label="same")
    assert rep.bit_equal and rep.max_abs == 0.0 and rep.mean_abs == 0.0 and rep.n_differ == 0
    assert rep.numel == 12 and rep.n_tensors == 1
    assert rep.as_text() == "same: bit-equal (12 elements, 1 tensor(s))"
    assert json.loads(json.dumps(rep.as_dict()))["bit_equal"] is True


def test_one_ulp_difference_is_counted_with_magnitude():
    a = _t()
    b = a.clone()
    b[1, 2] = torch.nextafter(b[1, 2], torch.tensor(float("inf")))
    d = float((b[1, 2].double() - a[1, 2].double()).abs())
    rep = compare_outputs(a, b)
    assert not rep.bit_equal and rep.n_differ == 1
    assert rep.max_abs == pytest.approx(d) and rep.mean_abs == pytest.approx(d / 12)
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
    with pytest.raises(CompareShapeError, match=r"shapes differ: \(3, 4\).*\(4, 3\)"):
        compare_outputs(a, a.T.contiguous())
    with pytest.raises(CompareShapeError, match="structures differ"):
        compare_outputs((a, a), (a,))
    with pytest.raises(CompareShapeError, match="structures differ"):
        compare_outputs({"a": a}, {"b": a})
    with pytest.raises(CompareShapeError, match="tensor vs"):
        compare_outputs(a, 3)
    assert issubclass(CompareShapeError, ValueError)


def test_compare_outputs_reports_a_reordered_reduction_of_a_real_model():
    model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 8)).requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.copy_(torch.randn(p.shape, generator=gen) / 16)
    x = torch.randn(4, 256, generator=gen)

    def reordered(t):  # same math, different summation order in the first layer
        w, b = model[0].weight, model[0].bias
        h = (t[:, :128] @ w[:, :128].T + t[:, 128:] @ w[:, 128:].T) + b
        return model[2](model[1](h))

    ref = model(x)
    assert compare_outputs(ref, model(x)).bit_equal  # run-to-run
    rep = compare_outputs(ref, reordered(x), label="split-K")
    print(rep.as_text())
    assert rep.max_abs < 1e-4  # float rounding only; equality is reported, not assumed
    other = compare_outputs(ref, model(torch.randn(4, 256, generator=gen)))
    assert not other.bit_equal and other.max_abs > 1e-3  # output depends on input
