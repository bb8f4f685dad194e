"""Digests are bit identity with dtype and shape; images hash as SaveImage writes them."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from steadfast.core.record import hashing
from steadfast.core.record.hashing import hash_image, hash_latent, image_to_uint8, short, tensor_bytes, tensor_digest

COMFY_NODES = Path(os.environ.get("COMFYUI_PATH", Path.home() / "comfy" / "ComfyUI")).expanduser() / "nodes.py"


def test_digest_format_is_header_plus_c_order_bytes():
    t = torch.randn(2, 3, 4, 5)
    expected = hashlib.sha256(b"torch.float32|(2, 3, 4, 5)|" + t.numpy().tobytes()).hexdigest()
    assert tensor_digest(t) == expected
    assert re.fullmatch(r"[0-9a-f]{64}", tensor_digest(t))
    assert tensor_digest(t) == tensor_digest(t.clone())


def test_shape_is_part_of_the_digest():
    a, b = torch.zeros(1, 16, 8, 8), torch.zeros(1, 32, 4, 8)
    assert a.numpy().tobytes() == b.numpy().tobytes()  # raw bytes alone cannot tell them apart
    assert tensor_digest(a) != tensor_digest(b)


def test_dtype_is_part_of_the_digest():
    a, b = torch.zeros(1, 4, 8, 8, dtype=torch.float32), torch.zeros(1, 4, 8, 16, dtype=torch.float16)
    assert tensor_bytes(a).tobytes() == tensor_bytes(b).tobytes()
    assert tensor_digest(a) != tensor_digest(b)
    c = torch.zeros(1, 4, 8, 16, dtype=torch.bfloat16)  # same bytes as the fp16 zeros
    assert tensor_digest(b) != tensor_digest(c)


def test_every_bit_counts():
    t = torch.randn(1, 4, 8, 8)
    u = t.clone()
    u.view(torch.int32)[0, 2, 3, 4] ^= 1  # flip the lowest mantissa bit of one value
    assert not torch.equal(t, u)
    assert tensor_digest(t) != tensor_digest(u)


def test_negative_zero_differs_although_torch_equal():
    pos, neg = torch.tensor([0.0]), torch.tensor([-0.0])
    assert torch.equal(pos, neg)
    assert tensor_digest(pos) != tensor_digest(neg)


def test_nan_equals_nan_by_bytes_although_not_torch_equal():
    a, b = torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0])
    assert not torch.equal(a, b)
    assert tensor_digest(a) == tensor_digest(b)


def test_layout_does_not_matter():
    t = torch.randn(2, 4, 8, 8)
    cl = t.to(memory_format=torch.channels_last)
    assert not cl.is_contiguous()
    assert tensor_digest(cl) == tensor_digest(t)
    transposed = torch.randn(8, 5).t()
    assert tensor_digest(transposed) == tensor_digest(transposed.contiguous())
    sliced = torch.randn(4, 10)[:, ::3]
    assert tensor_digest(sliced) == tensor_digest(sliced.contiguous())


@pytest.mark.parametrize(
    "dtype",
    [torch.bfloat16, torch.float16, torch.bool, torch.int64, torch.complex64, torch.float8_e4m3fn, torch.uint8],
)
def test_all_dtypes_hash(dtype):
    t = (torch.randn(2, 3, 4) * 3).to(dtype)
    d = tensor_digest(t)
    assert re.fullmatch(r"[0-9a-f]{64}", d)
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    assert d == hashlib.sha256(f"{dtype}|(2, 3, 4)|".encode() + raw).hexdigest()


def test_bf16_digest_uses_bit_pattern():
    t = torch.randn(4, 4).to(torch.bfloat16)
    bits = t.view(torch.int16).numpy().tobytes()
    assert tensor_digest(t) == hashlib.sha256(b"torch.bfloat16|(4, 4)|" + bits).hexdigest()


def test_requires_grad_and_edge_shapes():
    t = torch.randn(3, requires_grad=True)
    assert tensor_digest(t) == tensor_digest(t.detach())
    assert tensor_digest(torch.tensor(1.0)) != tensor_digest(torch.tensor([1.0]))  # () vs (1,)
    assert tensor_digest(torch.zeros(0, 3)) != tensor_digest(torch.zeros(3, 0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensor_hashes_like_cpu():
    t = torch.randn(1, 4, 8, 8)
    assert tensor_digest(t.cuda()) == tensor_digest(t)


def test_rejects_non_tensors_and_sparse():
    with pytest.raises(TypeError):
        tensor_digest(np.zeros(3))
    with pytest.raises(TypeError):
        tensor_digest(torch.zeros(3, 3).to_sparse())


# ----------------------------------------------------------------------------- images


def _saveimage_formula(images: torch.Tensor) -> np.ndarray:
    """ComfyUI SaveImage.save_images, per image (nodes.py, v0.8.0)."""
    out = []
    for image in images:
        i = 255.0 * image.cpu().numpy()
        out.append(np.clip(i, 0, 255).astype(np.uint8))
    return np.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_image_to_uint8_matches_saveimage_formula(dtype):
    g = torch.Generator().manual_seed(0)
    image = (torch.rand(2, 16, 16, 3, generator=g) * 1.4 - 0.2).to(dtype)  # includes <0 and >1
    ours = image_to_uint8(image)
    assert ours.dtype == np.uint8 and ours.shape == (2, 16, 16, 3)
    assert np.array_equal(ours, _saveimage_formula(image))


def test_image_to_uint8_truncates_and_clips():
    image = torch.tensor([0.999, 0.5, 1.5, -0.2, 1.0, 0.0, 1 / 255]).reshape(1, 1, 7, 1)
    assert image_to_uint8(image).reshape(-1).tolist() == [254, 127, 255, 0, 255, 0, 1]


@pytest.mark.comfyui
@pytest.mark.skipif(
    not COMFY_NODES.is_file(),
    reason=f"ComfyUI NOT FOUND at {COMFY_NODES}: SaveImage's formula is NOT re-checked against its source in this run",
)
def test_saveimage_source_still_uses_this_formula():
    src = COMFY_NODES.read_text()
    body = src[src.index("class SaveImage") :]
    body = body[: body.index("\nclass ", 1)]
    assert "i = 255. * image.cpu().numpy()" in body
    assert "np.clip(i, 0, 255).astype(np.uint8)" in body


def test_image_to_uint8_validates():
    with pytest.raises(ValueError):
        image_to_uint8(torch.rand(16, 16, 3))
    with pytest.raises(TypeError):
        image_to_uint8(torch.zeros(1, 4, 4, 3, dtype=torch.uint8))
    bf = torch.rand(1, 4, 4, 3).to(torch.bfloat16)  # SaveImage would fail on bf16; we widen first
    assert np.array_equal(image_to_uint8(bf), _saveimage_formula(bf.float()))


def test_hash_image_saved_pixels_vs_raw():
    image = torch.full((1, 4, 4, 3), 0.5)
    nudged = image.clone()
    nudged[0, 1, 1, 0] += 1e-4  # 127.5 -> 127.53: same uint8 pixel, different float
    assert hash_image(image) == hash_image(nudged)
    assert hash_image(image, raw=True) != hash_image(nudged, raw=True)
    assert hash_image(image) == tensor_digest(torch.from_numpy(image_to_uint8(image)))
    assert hash_image(image, raw=True) == tensor_digest(image)
    nudged[0, 1, 1, 0] = 0.51  # 130.05 -> 130: a different saved pixel
    assert hash_image(image) != hash_image(nudged)


def test_hash_image_raw_widens_half_precision():
    half = torch.rand(1, 4, 4, 3).to(torch.float16)
    assert hash_image(half, raw=True) == tensor_digest(half.float())


def test_hash_latent_and_short():
    samples = torch.randn(1, 4, 8, 8)
    assert hash_latent(samples) == tensor_digest(samples)
    d = hash_latent(samples)
    assert short(d) == d[:12] and short(d, 8) == d[:8]
    with pytest.raises(ValueError):
        short(d, 0)


def test_hash_inputs_image_and_latent():
    from steadfast.core.record.hashing import hash_inputs

    image, samples = torch.rand(1, 4, 4, 3), torch.randn(1, 4, 8, 8)
    both = hash_inputs(image=image, latent={"samples": samples, "batch_index": [0]}, raw_float=True)
    assert both.primary == both.image == hash_image(image)
    assert both.image_raw == hash_image(image, raw=True)
    assert both.latent == hash_latent(samples)
    assert both.image in both.as_text() and both.latent in both.as_text()
    only_latent = hash_inputs(latent=samples)
    assert only_latent.primary == hash_latent(samples) and only_latent.image is None
    assert hash_inputs(image=image).image_raw is None
    with pytest.raises(ValueError):
        hash_inputs()
    with pytest.raises(ValueError):
        hash_inputs(latent={"noise_mask": samples})


def test_check_expected():
    from steadfast.core.record.hashing import check_expected

    d = tensor_digest(torch.zeros(3))
    assert check_expected(d, "").status == "unchecked" and not check_expected(d, None).checked
    full = check_expected(d, d.upper() + "  ")
    assert full.checked and full.match and full.status == "match"
    assert check_expected(d, d[:12]).match
    # the report shows the digest on its own line: the MATCH line never repeats the 64 hex
    assert d not in full.as_text() and full.as_text().startswith("MATCH")
    assert check_expected(d, d[:12]).as_text().endswith(f"12-hex prefix {d[:12]}")
    other = "0" * 12 if not d.startswith("0" * 12) else "f" * 12
    miss = check_expected(d, other)
    assert miss.checked and not miss.match and miss.status == "mismatch" and "MISMATCH" in miss.as_text()
    for bad in ("abc", "zz" * 8, "0" * 65):
        with pytest.raises(ValueError):
            check_expected(d, bad)


def test_one_hash_rule_for_every_place_that_takes_a_hash() -> None:
    """hashing.hash_reference is the rule; the Hash node's validation, check_expected, verdict.check_hash and the
    run record's output_sha256 agree with it on the same texts."""
    from steadfast.core.record import verdict

    full = "ab" * 32
    cases = {"": "", "  " + full.upper() + " ": full, "abcdef012345": "abcdef012345"}
    for text, want in cases.items():
        assert hashing.hash_reference(text) == want
    bad = ["abcdef01234", "g" * 12, full + "0", "abc def 0123"]
    for text in bad:
        with pytest.raises(ValueError, match="prefix of at least 12"):
            hashing.hash_reference(text)
        with pytest.raises(ValueError, match="prefix of at least 12"):
            hashing.check_expected(full, text)
        with pytest.raises(ValueError, match="prefix of at least 12"):
            verdict.check_hash(text)
    with pytest.raises(ValueError, match="a reference hash"):
        verdict.check_hash("")  # a reference is required there
    assert hashing.check_expected(full, "").status == "unchecked"
    assert hashing.is_sha256(full) and not hashing.is_sha256(full.upper()) and not hashing.is_sha256(full[:12])
