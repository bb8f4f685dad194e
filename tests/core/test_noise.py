"""Seeded noise: ComfyUI bit-compatibility, per-item incremental seeds, and no global-RNG use.

The references are independent of the pack's noise code: ComfyUI's own ``prepare_noise`` and ``torch.randn``
itself, each drawn in a fresh subprocess under ``ATEN_CPU_CAPABILITY=avx2`` (torch's x86 AVX2 kernel, the bytes
portable noise promises). Where that kernel does not exist (not x86, no AVX2) or draws half types with another
algorithm (torch < 2.14), the comparison is skipped with the reason; CI row 2 runs this module on torch 2.14.1
(marker ``torch_version``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from steadfast.core.determinism.noise import MAX_SEED, CPUNoiseSampler, check_seed, item_seeds, seeded_noise
from steadfast.core.determinism.randn import portable_randn
from steadfast.core.record.hashing import tensor_digest

COMFY = Path(os.environ.get("COMFYUI_PATH", Path.home() / "comfy" / "ComfyUI")).expanduser()

pytestmark = pytest.mark.torch_version  # half-type branches differ by torch version: CI runs both rows


def _global_draw_after(fn, seed=123):
    """What the global RNG yields after ``fn()`` when it was seeded with ``seed`` before."""
    torch.manual_seed(seed)
    fn()
    return torch.rand(8)


@pytest.fixture(autouse=True)
def _keep_global_rng():
    with torch.random.fork_rng(devices=[]):
        yield


# ----------------------------------------------------------------------------- comfy mode


SHAPES = [(1, 4, 8, 8), (3, 4, 16, 16), (2, 16, 3, 8, 8)]
DTYPES = ["float32", "float16", "bfloat16"]
TORCH_AVX2_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    shapes, dtypes, seed, out = eval(sys.argv[1]), eval(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    cases = {"capability": str(torch.backends.cpu.get_cpu_capability()), "torch": str(torch.__version__)}
    for shape in shapes:
        for dtype in dtypes:
            torch.manual_seed(seed)  # what ComfyUI's prepare_noise does (comfy/sample.py)
            cases[f"manual_seed:{shape}:{dtype}"] = torch.randn(shape, dtype=getattr(torch, dtype), device="cpu")
            g = torch.Generator().manual_seed(3)  # what a CPU noise sampler's generator draws
            cases[f"generator3:{shape}:{dtype}"] = torch.randn(shape, dtype=getattr(torch, dtype), generator=g)
    torch.save(cases, out)
    """
)
SEED = 1234567


@pytest.fixture(scope="module")
def torch_avx2(tmp_path_factory) -> dict:
    """``torch.randn`` itself, in a fresh process under ``ATEN_CPU_CAPABILITY=avx2`` (read at start-up): the
    independent reference for the pack's noise. Skips, naming why, where torch has no AVX2 kernel."""
    out = tmp_path_factory.mktemp("randn") / "avx2.pt"
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_AVX2_SCRIPT, repr(SHAPES), repr(DTYPES), str(SEED), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = torch.load(out)
    if cases["capability"] not in ("AVX2", "AVX512"):
        pytest.skip(
            f"torch has no AVX2 randn kernel on this machine ({cases['capability']}): the pack's noise is "
            "NOT compared with torch.randn here (the golden digest in test_portable_randn.py stands in)"
        )
    return cases


def _skip_half_before_2_14(dtype: torch.dtype) -> None:
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if dtype != torch.float32 and version < (2, 14):
        pytest.skip(
            f"torch {torch.__version__} draws {dtype} with another algorithm than its float32 AVX2 kernel; "
            "portable noise follows torch >= 2.14: compared on CI row 2 (torch 2.14.1), not here"
        )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_comfy_mode_matches_torch_manual_seed_semantics(torch_avx2, shape, dtype):
    """``seeded_noise(mode="comfy")`` = ``torch.manual_seed(seed); torch.randn(shape)`` on an x86 PC (torch's
    AVX2 kernel, drawn in another process): what ComfyUI's own noise is there."""
    _skip_half_before_2_14(dtype)
    ours = seeded_noise(shape, SEED, mode="comfy", dtype=dtype)
    assert ours.dtype == dtype and tuple(ours.shape) == shape and ours.device.type == "cpu"
    ref = torch_avx2[f"manual_seed:{shape}:{str(dtype).split('.')[1]}"]
    assert tensor_digest(ours) == tensor_digest(ref)


def test_comfy_mode_batch_index_picks_items_of_the_stream():
    seed, item = 77, (1, 4, 8, 8)
    gen = torch.Generator().manual_seed(seed)
    stream = [portable_randn(item, gen) for _ in range(4)]  # the seed's successive batch-1 draws
    ours = seeded_noise((3, 4, 8, 8), seed, mode="comfy", batch_index=[3, 0, 3])
    assert torch.equal(ours[0:1], stream[3])
    assert torch.equal(ours[1:2], stream[0])
    assert torch.equal(ours[2:3], stream[3])


def test_comfy_mode_does_not_touch_global_rng():
    untouched = _global_draw_after(lambda: None)
    after = _global_draw_after(lambda: seeded_noise((2, 4, 8, 8), 5, mode="comfy", batch_index=[1, 0]))
    assert torch.equal(after, untouched)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    seeded_noise((1, 4, 8, 8), 5, mode="comfy")
    assert torch.equal(torch.get_rng_state(), state)


# (name, shape, dtype, seed, batch_index). Odd item sizes matter: for them one [N,...] draw is NOT
# the same as N successive [1,...] draws, so the batch_index path must consume the stream item by item.
COMFY_CASES = [
    ("b1", (1, 4, 8, 8), torch.float32, 0, None),
    ("b3", (3, 4, 16, 16), torch.float32, 123456789, None),
    ("odd", (3, 3, 5, 7), torch.float32, 5, None),
    ("video", (2, 16, 3, 8, 8), torch.float32, 42, None),
    ("fp16", (2, 4, 8, 8), torch.float16, 7, None),
    ("bf16", (2, 4, 8, 8), torch.bfloat16, 7, None),
    ("fp16_odd_inds", (3, 3, 5, 7), torch.float16, 11, [1, 0, 1]),
    ("bf16_inds", (2, 4, 8, 8), torch.bfloat16, 11, [3, 0]),
    ("inds", (3, 4, 8, 8), torch.float32, 99, [2, 0, 2]),
    ("inds_odd", (3, 3, 5, 7), torch.float32, 99, [2, 0, 2]),
    ("inds_video", (2, 16, 2, 8, 8), torch.float32, 99, [5, 1]),
    ("big_seed", (1, 4, 8, 8), torch.float32, 2**64 - 1, None),
]

COMFY_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    sys.path.insert(0, sys.argv[1])
    import comfy.cli_args
    comfy.cli_args.args.cpu = True  # no GPU needed to import comfy.sample
    import comfy.sample
    import comfy.k_diffusion.sampling as kds
    import importlib.util
    spec = importlib.util.spec_from_file_location("comfy_noise", sys.argv[3])
    comfy_noise = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(comfy_noise)

    cases = {}
    for name, shape, dtype, seed, inds in CASES:
        latent = torch.zeros(shape, dtype=dtype)
        cases[name] = comfy.sample.prepare_noise(latent, seed, inds)
        cases["draw_dtype:" + name] = comfy_noise.draw_dtype(dtype)  # what the Seeded Sampler passes
    x = torch.zeros(2, 4, 8, 8)
    ns = kds.default_noise_sampler(x, seed=10)
    cases["sampler"] = torch.stack([ns(1.0, 0.5) for _ in range(3)])
    cases["capability"] = torch.backends.cpu.get_cpu_capability()
    torch.save(cases, sys.argv[2])
    """
).replace("CASES", repr(COMFY_CASES))


@pytest.fixture(scope="module")
def comfy_reference(tmp_path_factory):
    if not (COMFY / "comfy" / "sample.py").is_file():
        pytest.skip(
            f"ComfyUI NOT FOUND at {COMFY}: bit-compatibility with comfy.sample.prepare_noise "
            "is NOT verified in this run"
        )
    out = tmp_path_factory.mktemp("comfy") / "noise.pt"
    script = out.parent / "ref.py"
    script.write_text(COMFY_SCRIPT)
    comfy_noise = Path(__file__).resolve().parents[2] / "nodes" / "host" / "noise.py"
    # ComfyUI as on an x86 PC (torch's AVX2 randn kernel), whatever ATEN_CPU_CAPABILITY this run has:
    # the pack's noise is portable, ComfyUI's own is not (issue 17)
    proc = subprocess.run(
        [sys.executable, str(script), str(COMFY), str(out), str(comfy_noise)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(out.parent),
        env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = torch.load(out)
    if cases["capability"] not in ("AVX2", "AVX512"):
        pytest.skip(
            f"torch runs no AVX2 kernel here ({cases['capability']}): ComfyUI's own noise is not the "
            "x86 noise the pack draws, so bit-compatibility with ComfyUI is NOT checked on this CPU"
        )
    return cases


@pytest.mark.comfyui
@pytest.mark.parametrize("name, shape, dtype, seed, inds", COMFY_CASES, ids=[c[0] for c in COMFY_CASES])
def test_comfy_mode_bit_identical_to_comfyui(comfy_reference, name, shape, dtype, seed, inds):
    """Runs ComfyUI's own prepare_noise in a subprocess (so its imports stay out of this process).

    The draw dtype is what ``nodes/host/noise.draw_dtype`` learned from the same running ComfyUI (0.8.0
    draws in the latent's dtype, 0.33.0 draws float32 and casts), exactly as the Seeded Sampler passes it.
    """
    draw = comfy_reference["draw_dtype:" + name]
    ours = seeded_noise(shape, seed, mode="comfy", dtype=dtype, batch_index=inds, draw_dtype=draw)
    assert tensor_digest(ours) == tensor_digest(comfy_reference[name])


@pytest.mark.comfyui
def test_cpu_noise_sampler_matches_comfyui_cpu_default_noise_sampler(comfy_reference):
    x = torch.zeros(2, 4, 8, 8)
    sampler = CPUNoiseSampler(x, 10 + 1)  # ComfyUI adds 1 to the seed on the CPU
    ours = torch.stack([sampler(1.0, 0.5) for _ in range(3)])
    assert tensor_digest(ours) == tensor_digest(comfy_reference["sampler"])


# ----------------------------------------------------------------------------- incremental mode


@pytest.mark.parametrize("shape", [(4, 4, 8, 8), (3, 16, 2, 8, 8)])
def test_incremental_item_equals_batch1_call_at_seed_plus_i(shape):
    seed = 1000
    batch = seeded_noise(shape, seed)
    assert tuple(batch.shape) == shape
    for i in range(shape[0]):
        single = seeded_noise((1, *shape[1:]), seed + i)
        assert torch.equal(batch[i : i + 1], single)
        assert torch.equal(single, portable_randn((1, *shape[1:]), torch.Generator().manual_seed(seed + i)))


def test_incremental_prefix_stable_when_batch_grows():
    small = seeded_noise((2, 4, 8, 8), 5)
    big = seeded_noise((5, 4, 8, 8), 5)
    assert torch.equal(big[:2], small)
    assert not torch.equal(big[0], big[1])  # items are not copies of each other


def test_incremental_batch_index_uses_seed_plus_index():
    out = seeded_noise((2, 4, 8, 8), 50, batch_index=[3, 1])
    assert torch.equal(out[0:1], seeded_noise((1, 4, 8, 8), 53))
    assert torch.equal(out[1:2], seeded_noise((1, 4, 8, 8), 51))


def test_incremental_does_not_touch_global_rng():
    untouched = _global_draw_after(lambda: None)
    assert torch.equal(_global_draw_after(lambda: seeded_noise((3, 4, 8, 8), 9)), untouched)


def test_seed_changes_noise_and_same_seed_repeats():
    for mode in ("incremental", "comfy"):
        a = seeded_noise((2, 4, 8, 8), 1, mode=mode)
        assert torch.equal(a, seeded_noise((2, 4, 8, 8), 1, mode=mode))
        assert not torch.equal(a, seeded_noise((2, 4, 8, 8), 2, mode=mode))
        assert 0.5 < float(a.std()) < 1.5  # standard normal, roughly


@pytest.mark.parametrize(
    "shape, seed, kwargs",
    [
        ((0, 4, 8, 8), 0, {}),  # empty batch
        ((4, 8, 8), 0, {}),  # 3-D
        ((1, 1, 1, 4, 8, 8), 0, {}),  # 6-D
        ((1, 4, 0, 8), 0, {}),  # empty dimension
        ((1, 4, 8, 8), -1, {}),  # negative seed
        ((1, 4, 8, 8), 2**64, {}),  # above ComfyUI's range
        ((2, 4, 8, 8), 2**64 - 1, {}),  # incremental seed + 1 overflows
        ((1, 4, 8, 8), 0, {"mode": "gpu"}),
        ((2, 4, 8, 8), 0, {"batch_index": [0]}),
        ((1, 4, 8, 8), 0, {"batch_index": [-1]}),
        ((1, 4, 8, 8), 0, {"batch_index": [-1], "mode": "comfy"}),
    ],
)
def test_seeded_noise_rejects_bad_input(shape, seed, kwargs):
    with pytest.raises(ValueError):
        seeded_noise(shape, seed, **kwargs)


def test_seeded_noise_rejects_non_int_seed():
    with pytest.raises(TypeError):
        seeded_noise((1, 4, 8, 8), 1.0)


def test_check_seed_is_the_one_seed_check():
    import numpy as np

    from steadfast.core.determinism.policy import DeterminismPolicy
    from steadfast.core.pipelines.run import image_generators

    assert MAX_SEED == 2**64 - 1
    assert check_seed(np.uint64(MAX_SEED)) == MAX_SEED and type(check_seed(np.int32(7))) is int
    assert check_seed(MAX_SEED - 3, count=4) == MAX_SEED - 3
    with pytest.raises(ValueError, match=r"seed \+ batch index exceeds"):
        check_seed(MAX_SEED - 3, count=5)
    with pytest.raises(TypeError, match="policy seed must be an int, got bool"):
        check_seed(True, name="policy seed")
    # every caller gives the same errors
    for call in (
        lambda s: seeded_noise((1, 4, 2, 2), s),
        lambda s: DeterminismPolicy(seed=s),
        lambda s: image_generators(s, 1),
        lambda s: CPUNoiseSampler(torch.zeros(1), s),
    ):
        with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64 - 1\], got -1"):
            call(-1)
        with pytest.raises(TypeError, match="seed must be an int, got float"):
            call(1.0)
    with pytest.raises(ValueError, match="exceeds"):
        image_generators(MAX_SEED, 2)


def test_item_seeds_is_item_i_equals_seed_plus_i():
    assert item_seeds(7, 3) == item_seeds(7, 3, "incremental") == [7, 8, 9]
    assert item_seeds(7, 3, "comfy") == [7, 7, 7]  # one stream for the batch, seeded once
    assert item_seeds(50, 2, batch_index=[3, 1]) == [53, 51]
    assert item_seeds(50, 2, "comfy", batch_index=[3, 1]) == [50, 50]
    assert item_seeds(MAX_SEED - 2, 3) == [MAX_SEED - 2, MAX_SEED - 1, MAX_SEED]
    assert [type(s) for s in item_seeds(np.uint64(5), 2)] == [int, int]
    for bad in (
        {"batch": 0},
        {"mode": "gpu"},
        {"batch_index": [0]},
        {"batch_index": [0, -1]},
        {"seed": MAX_SEED - 1, "batch": 3},
        {"seed": 0, "batch_index": [0, MAX_SEED + 1]},
    ):
        args = {"seed": 0, "batch": 2, **bad}
        with pytest.raises(ValueError):
            item_seeds(**args)
    with pytest.raises(TypeError):
        item_seeds(1.0, 1)


def test_every_batch_derives_its_seeds_from_item_seeds():
    """Initial noise, per-step noise and a pipeline's generators give item j what a batch-1 run at item_seeds[j]
    gives (the run record's ``seeds`` are the same list: tests/core/test_run_record.py)."""
    from steadfast.core.pipelines.run import image_generators

    seeds = item_seeds(40, 3, batch_index=[2, 0, 5])
    out = seeded_noise((3, 4, 2, 2), 40, batch_index=[2, 0, 5])
    for j, s in enumerate(seeds):
        assert torch.equal(out[j : j + 1], seeded_noise((1, 4, 2, 2), s))
    per_step = CPUNoiseSampler(torch.zeros(3, 4, 2, 2), 40, per_item=True)()
    gens = image_generators(40, 3)
    for j, s in enumerate(item_seeds(40, 3)):
        assert torch.equal(per_step[j : j + 1], CPUNoiseSampler(torch.zeros(1, 4, 2, 2), s)())
        assert gens[j].initial_seed() == s


# ----------------------------------------------------------------------------- CPUNoiseSampler


def test_cpu_noise_sampler_deterministic_and_like_x():
    x = torch.zeros(2, 4, 8, 8, dtype=torch.float16)
    s1, s2 = CPUNoiseSampler(x, 3), CPUNoiseSampler(x, 3)
    first = [s1(1.0, 0.5) for _ in range(3)]
    second = [s2(1.0, 0.5) for _ in range(3)]
    for a, b in zip(first, second):
        assert torch.equal(a, b)
        assert a.shape == x.shape and a.dtype == x.dtype and a.device == x.device
    assert not torch.equal(first[0], first[1])  # successive steps draw fresh noise
    assert not torch.equal(first[0], CPUNoiseSampler(x, 4)(1.0, 0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cpu_noise_sampler_draws_what_torch_avx2_randn_draws(torch_avx2, dtype):
    """The first step of ``CPUNoiseSampler(x, 3)`` = ``torch.randn(x.shape, generator=manual_seed(3))`` under
    torch's AVX2 kernel (another process): ComfyUI's CPU noise sampler on an x86 PC."""
    _skip_half_before_2_14(dtype)
    x = torch.zeros(SHAPES[0], dtype=dtype)
    ref = torch_avx2[f"generator3:{SHAPES[0]}:{str(dtype).split('.')[1]}"]
    assert torch.equal(CPUNoiseSampler(x, 3)(1.0, 0.5), ref)


def test_cpu_noise_sampler_independent_of_global_rng():
    x = torch.zeros(1, 4, 8, 8)
    reference = [CPUNoiseSampler(x, 11)(None, None)]
    sampler = CPUNoiseSampler(x, 11)
    torch.manual_seed(0)
    a = sampler(1.0, 0.5)
    torch.manual_seed(999)  # reseeding / consuming the global RNG between steps changes nothing
    torch.rand(100)
    b = sampler(0.5, 0.1)
    fresh = CPUNoiseSampler(x, 11)
    assert torch.equal(a, reference[0]) and torch.equal(a, fresh())
    assert torch.equal(b, fresh())
    untouched = _global_draw_after(lambda: None)
    assert torch.equal(_global_draw_after(lambda: CPUNoiseSampler(x, 11)(1.0, 0.5)), untouched)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_noise_sampler_same_noise_on_cuda():
    cpu = CPUNoiseSampler(torch.zeros(1, 4, 8, 8), 5)()
    gpu = CPUNoiseSampler(torch.zeros(1, 4, 8, 8, device="cuda"), 5)()
    assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)


def test_cpu_noise_sampler_rejects_bad_input():
    with pytest.raises(TypeError):
        CPUNoiseSampler([1, 2], 0)
    with pytest.raises(ValueError):
        CPUNoiseSampler(torch.zeros(1), -5)


def test_cpu_noise_sampler_per_item_matches_batch1_runs():
    x = torch.zeros(3, 4, 8, 8)
    batched = CPUNoiseSampler(x, 20, per_item=True)
    singles = [CPUNoiseSampler(x[i : i + 1], 20 + i) for i in range(3)]
    for _ in range(2):  # two steps: every item keeps its own stream
        step = batched(1.0, 0.5)
        assert step.shape == x.shape
        for i, single in enumerate(singles):
            assert torch.equal(step[i : i + 1], single(1.0, 0.5))
    assert not torch.equal(CPUNoiseSampler(x, 20)(), CPUNoiseSampler(x, 20, per_item=True)())
    with pytest.raises(ValueError):
        CPUNoiseSampler(torch.zeros(2, 4), 2**64 - 1, per_item=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_draw_dtype_float32_then_cast_differs_from_drawing_in_the_dtype(dtype):
    """The two ways ComfyUI has drawn half-precision noise give different bytes (so following the running one matters).

    1000 elements: torch 2.14.1's CPU half randn equals float32-then-cast for 8, 16, 256 elements, not for 1000
    (measured on this pack's CI machine); torch 2.11.0's differs from 16 elements on.
    """
    native = seeded_noise((1, 4, 25, 10), 3, mode="comfy", dtype=dtype)
    cast = seeded_noise((1, 4, 25, 10), 3, mode="comfy", dtype=dtype, draw_dtype=torch.float32)
    ref = portable_randn((1, 4, 25, 10), torch.Generator().manual_seed(3)).to(dtype)  # float32 noise, cast
    assert cast.dtype == native.dtype == dtype
    assert torch.equal(cast, ref)
    assert not torch.equal(cast, native)
