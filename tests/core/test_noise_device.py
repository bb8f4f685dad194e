"""Issue 23: noise and output tensors on the device their consumer uses, handed over without stalling it,
and portable noise at torch.randn's cost where torch's own bytes are the portable ones.

GPU-only checks are marked ``gpu`` (skipped without CUDA; ``benchmarks/gpu_protocol.py`` runs them on a lent GPU).
"""

from __future__ import annotations

import threading

import pytest
import torch

from steadfast.core.determinism import randn as pr
from steadfast.core.determinism import randn_route as route
from steadfast.core.determinism.noise import CPUNoiseSampler
from steadfast.core.record import hashing, verdict
from steadfast.core.record.compare import compare

CUDA = torch.cuda.is_available()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("per_item", [False, True])
def test_prefetched_noise_is_byte_identical_to_synchronous_draws(per_item):
    """The next step's draw on a background thread: the same draws, in the same order, byte for byte."""
    x = torch.zeros(3, 4, 9, 7)
    sync = CPUNoiseSampler(x, 21, per_item=per_item, prefetch=False)
    ahead = CPUNoiseSampler(x, 21, per_item=per_item, prefetch=True)
    names = set()
    for step in range(6):
        a, b = sync(torch.tensor(1.0 - step / 10), None), ahead(torch.tensor(1.0 - step / 10), None)
        assert torch.equal(_bits(a), _bits(b)), step
        assert ahead._pending is not None  # the next draw is already under way
        names |= {t.name for t in threading.enumerate()}
    assert any(n.startswith("steadfast-noise") for n in names)
    assert not torch.equal(_bits(sync()), _bits(CPUNoiseSampler(x, 22, per_item=per_item)()))  # the seed matters
    ahead.close()
    assert ahead._executor is None and ahead._pending is None


def test_prefetch_is_off_on_the_cpu_and_on_for_another_device():
    x = torch.zeros(1, 4, 8, 8)
    cpu = CPUNoiseSampler(x, 3)
    cpu(torch.tensor(1.0), torch.tensor(0.5))
    assert cpu._pending is None and cpu._executor is None  # on the CPU the draw would compete with the model
    other = CPUNoiseSampler(x, 3)
    first = other(torch.tensor(1.0, device="meta"), torch.tensor(0.5, device="meta"))
    assert first.device.type == "meta" and first.shape == x.shape and first.dtype == x.dtype
    assert other._pending is not None
    other.close()


@pytest.mark.parametrize("where", ["sigma", "sigma_next", "none"])
def test_noise_goes_to_the_device_of_sigma_not_of_the_latent(where):
    """ComfyUI builds nothing on the GPU: the LATENT stays on the CPU, ``x``/``sigmas`` move to the model's device."""
    x_like = torch.zeros(2, 4, 8, 8)  # the CPU latent the node builds the sampler from
    meta = torch.tensor(1.0, device="meta")
    sampler = CPUNoiseSampler(x_like, 5, prefetch=False)
    args = {"sigma": (meta, None), "sigma_next": (0.7, meta), "none": (None, None)}[where]
    got = sampler(*args)
    assert got.device.type == ("cpu" if where == "none" else "meta")
    assert got.shape == x_like.shape


def test_float_sigmas_fall_back_to_the_latent_device():
    got = CPUNoiseSampler(torch.zeros(1, 4, 4, 4), 5)(1.0, 0.5)
    assert got.device.type == "cpu"


# ----------------------------------------------------------------------------- fast path keeps the bits


@pytest.mark.parametrize("dtype", pr.PORTABLE_DTYPES)
@pytest.mark.parametrize("n", [16, 17, 31, 1000, 16 * 1024 + 7, 4 * 64 * 64])
def test_auto_draw_equals_the_numpy_emulation(dtype, n):
    """Whatever ``draw_method`` picked here (torch.randn, float32 chunks or numpy), the bytes are the emulation's."""
    auto = pr.portable_randn((n,), torch.Generator().manual_seed(n), dtype=dtype)
    emulated = pr.portable_randn((n,), torch.Generator().manual_seed(n), dtype=dtype, backend="numpy")
    assert torch.equal(_bits(auto), _bits(emulated)), pr.draw_method(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_from_float32_chunks_equals_the_emulation_where_float32_is_torchs(dtype):
    if not pr.torch_draws_portable(torch.float32):
        pytest.skip("torch's float32 kernel is not the AVX2 one here: the chunked half path is not used")
    for n in (16, 23, 1024, 16 * 1024 + 7):
        g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
        chunked = pr._half_from_float32_kernel((n,), n, g1, dtype)
        emulated = pr.portable_randn((n,), g2, dtype=dtype, backend="numpy")
        assert torch.equal(_bits(chunked), _bits(emulated)), n
        assert torch.equal(g1.get_state(), g2.get_state()), n  # the stream advances the same


# ----------------------------------------------------------------------------- CUDA (the GPU protocol runs these)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA: the pinned, non-blocking hand-over is checked on a GPU")
def test_cuda_hand_over_is_pinned_non_blocking_and_byte_identical():
    x = torch.zeros(2, 4, 16, 16)
    cpu = CPUNoiseSampler(x, 9, per_item=True, prefetch=False)
    gpu = CPUNoiseSampler(x, 9, per_item=True)
    sig = torch.tensor([3.0, 2.0, 1.0, 0.5, 0.1], device="cuda")
    for i in range(4):
        out = gpu(sig[i], sig[i + 1])
        assert out.device.type == "cuda"
        assert torch.equal(_bits(out.cpu()), _bits(cpu(sig[i].cpu(), None))), i
    assert len(gpu._pinned) == 2 and all(b.is_pinned() for b in gpu._pinned)
    gpu.close()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA: Hash/Compare/verdict on CUDA tensors")
def test_hash_compare_and_thumbnail_take_cuda_tensors():
    image = torch.rand(1, 32, 32, 3, generator=torch.Generator().manual_seed(0))
    on_gpu = image.to("cuda")
    assert hashing.hash_image(on_gpu) == hashing.hash_image(image)
    assert verdict.thumbnail(on_gpu) == verdict.thumbnail(image)
    assert compare(on_gpu, on_gpu.clone(), kind="image").identical
    assert verdict.grade_tensors(on_gpu, on_gpu * 0.5, "image").level != "identical"


# ----------------------------------------------------------------------------- diffusers' half-precision draws


@pytest.mark.parametrize("dtype", pr.PORTABLE_DTYPES)
def test_pipeline_noise_is_routed_only_where_it_changes_bits_towards_the_portable_ones(dtype):
    """diffusers' ``randn_tensor`` (one CPU generator per image, in the latent dtype) under the pack's route.

    A dtype the route leaves alone gives plain diffusers' bytes (on torch 2.11 its own half algorithm, which the
    portable one is not: routing it changed ~99.9% of values); a routed dtype gives the portable bytes."""
    torch_utils = pytest.importorskip("diffusers.utils.torch_utils")
    shape = (2, 4, 16, 16)

    def gens():
        return [torch.Generator().manual_seed(5 + i) for i in range(2)]

    plain = torch_utils.randn_tensor(shape, generator=gens(), dtype=dtype)
    with route.portable_generator_randn():
        routed = torch_utils.randn_tensor(shape, generator=gens(), dtype=dtype)
    portable = torch.cat([pr.portable_randn((1, *shape[1:]), g, dtype=dtype, backend="numpy") for g in gens()])
    said = route.route_record()[str(dtype).removeprefix("torch.")]
    if dtype in route.routed_dtypes():
        assert said == "routed to portable_randn" and torch.equal(_bits(routed), _bits(portable))
    else:
        assert torch.equal(_bits(routed), _bits(plain)), said
        assert said.startswith("torch.randn")
        assert torch.equal(_bits(plain), _bits(portable)) == said.startswith("torch.randn (portable")
