"""Portable noise (issue 17 item 1): ``portable_randn`` gives torch's AVX2 CPU ``randn`` bytes on every ISA.

Three kinds of evidence:

- fresh subprocesses under ``ATEN_CPU_CAPABILITY=avx512 / avx2 / default`` (read once at start-up) draw
  the same portable bytes, equal to what ``torch.randn`` itself gives under ``avx2``, while torch's own
  ``default`` path gives other bytes for 16+ elements;
- an independent scalar pure-Python reference (own MT19937, ``struct`` float32 rounding, ``Fraction``
  FMAs, a line-by-line transcription of ``avx_mathfun.h``) matches bit for bit;
- a golden digest measured on an x86-64 AVX2 machine that every other platform must reproduce.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from steadfast.core.determinism import randn as pr
from steadfast.core.determinism import randn_route as route
from steadfast.core.determinism.randn import box_muller_avx2, portable_randn

pytestmark = pytest.mark.torch_version  # half types follow torch >= 2.14: CI runs this on both rows

REPO = Path(__file__).resolve().parents[2]

# n < 16 (scalar double path), multiples of 16, non-multiples, and large (1x16x32x33 + a tail)
SIZES = [1, 2, 7, 15, 16, 17, 31, 32, 100, 1000, 4099, 16 * 32 * 33 + 5]
SEEDS = [0, 42, 123456789, 2**32 + 7, 2**64 - 1]


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


# ----------------------------------------------------------------------------- the three ISAs

ISA_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys
    sys.path.insert(0, sys.argv[1])
    from _steadfast_import import import_steadfast
    import_steadfast()
    import torch
    from steadfast.core.determinism.randn import portable_randn
    SIZES, SEEDS = json.loads(sys.argv[2])
    def digest(t):
        return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    out = {"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
           "portable": {}, "numpy": {}, "randn": {}}
    for dtype in ("float32", "float16", "bfloat16"):
        dt = getattr(torch, dtype)
        for seed in SEEDS:
            for n in SIZES:
                key = f"{dtype}/{seed}/{n}"
                out["portable"][key] = digest(portable_randn((n,), torch.Generator().manual_seed(seed), dtype=dt))
                out["numpy"][key] = digest(portable_randn((n,), torch.Generator().manual_seed(seed), dtype=dt,
                                                          backend="numpy"))
                out["randn"][key] = digest(torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=dt))
        # one generator, mixed sizes: the cached double sample and the stream position carry over
        g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        seq_p = torch.cat([portable_randn((n,), g1, dtype=dt).float() for n in (3, 40, 5, 1, 17, 7, 16)])
        seq_t = torch.cat([torch.randn(n, generator=g2, dtype=dt).float() for n in (3, 40, 5, 1, 17, 7, 16)])
        out["portable"][dtype + "/sequence/-1"], out["randn"][dtype + "/sequence/-1"] = digest(seq_p), digest(seq_t)
    from steadfast.core.determinism import randn as pr, randn_route as route
    out["method"] = {d: pr.draw_method(getattr(torch, d)) for d in ("float32", "float16", "bfloat16")}
    out["routed"] = [str(d) for d in route.routed_dtypes()]
    # torchsde's Brownian-interval draw (ComfyUI's CPU BrownianTreeNoiseSampler), routed and not
    try:
        from torchsde._brownian import brownian_interval as bi
    except ImportError:
        bi = None
    if bi is not None:
        from steadfast.core.determinism.randn_route import portable_generator_randn
        draw = lambda: bi._randn((2, 4, 24, 24), torch.float32, torch.device("cpu"), 12345)
        with portable_generator_randn():
            out["portable"]["float32/torchsde/-2"] = digest(draw())
        out["randn"]["float32/torchsde/-2"] = digest(draw())
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def isa_runs():
    """``{capability setting: result}`` from one fresh interpreter per ``ATEN_CPU_CAPABILITY`` value."""
    runs = {}
    for isa in ("avx512", "avx2", "default"):
        env = {**os.environ, "ATEN_CPU_CAPABILITY": isa}
        proc = subprocess.run(
            [sys.executable, "-c", ISA_SCRIPT, str(REPO / "scripts"), json.dumps([SIZES, SEEDS])],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[isa] = json.loads(proc.stdout.strip().splitlines()[-1])
    return runs


def _torch_at_least(version: str, wanted: tuple[int, int]) -> bool:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2]) >= wanted


def _x86_avx2(run: dict) -> bool:
    return run["capability"] in ("AVX2", "AVX512")


def test_portable_bytes_identical_under_every_aten_cpu_capability(isa_runs):
    assert isa_runs["default"]["capability"] == "DEFAULT"  # the variable was honoured
    reference = isa_runs["avx2"]["portable"]
    for isa in ("avx512", "default"):
        assert isa_runs[isa]["portable"] == reference, isa
    numpy_keys = list(isa_runs["avx2"]["numpy"])
    assert numpy_keys
    for isa in ("avx512", "avx2", "default"):  # the emulation itself, whatever the fast path chose
        assert {k: isa_runs[isa]["numpy"][k] for k in numpy_keys} == {k: reference[k] for k in numpy_keys}, isa


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_portable_equals_torch_avx2_randn(isa_runs, dtype):
    run = isa_runs["avx2"]
    if not _x86_avx2(run):
        pytest.skip(f"no AVX2 torch kernel on this machine ({run['capability']}): the golden test stands in")
    if dtype != "float32" and not _torch_at_least(run["torch"], (2, 14)):
        pytest.skip(
            f"torch {run['torch']} draws {dtype} with another algorithm; portable noise follows torch >= "
            "2.14 (half types through the float32 AVX2 kernel): compared on CI row 2 (torch 2.14.1)"
        )
    keys = [k for k in run["numpy"] if k.startswith(dtype + "/")]
    # the numpy emulation (not the fast path, which is torch.randn itself here) against torch's kernel
    assert keys and all(run["numpy"][k] == run["randn"][k] for k in keys), [
        k for k in keys if run["numpy"][k] != run["randn"][k]
    ]


def test_fast_path_only_where_torch_gives_the_portable_bytes(isa_runs):
    """The start-up probe (16*1024+7 elements, a tail) picks torch.randn under AVX2/AVX512 and numpy under
    ``ATEN_CPU_CAPABILITY=default`` (what ARM and CPUs without AVX2 run), and routes torch.randn only there."""
    default = isa_runs["default"]
    assert default["method"]["float32"] == "numpy" and "torch.float32" in default["routed"]
    for isa in ("avx512", "avx2"):
        run = isa_runs[isa]
        if not _x86_avx2(run):
            pytest.skip(f"no AVX2 torch kernel on this machine ({run['capability']})")
        assert run["method"]["float32"] == "torch.randn" and "torch.float32" not in run["routed"], isa
        half = "torch.randn" if _torch_at_least(run["torch"], (2, 14)) else "torch.randn float32 chunks"
        assert run["method"]["float16"] == half and run["method"]["bfloat16"] == half, (isa, run["method"])


def test_torch_randn_under_avx512_equals_avx2(isa_runs):
    """torch's CPU normal kernel has no AVX512 build: ``ATEN_CPU_CAPABILITY=avx512`` draws the AVX2 bytes (every
    dtype, every size). On a CPU without AVX512 torch caps the request at AVX2, so here this checks the cap; the
    review of issue 25 found the same on an AVX512 CPU (docs/reproducing.md)."""
    if not _x86_avx2(isa_runs["avx2"]):
        pytest.skip(f"no AVX2 torch kernel on this machine ({isa_runs['avx2']['capability']})")
    assert isa_runs["avx512"]["capability"] in ("AVX2", "AVX512"), isa_runs["avx512"]["capability"]
    differ = [k for k in isa_runs["avx2"]["randn"] if isa_runs["avx512"]["randn"][k] != isa_runs["avx2"]["randn"][k]]
    assert not differ, differ


def test_torch_own_default_path_differs_so_the_check_means_something(isa_runs):
    """torch's scalar (libm) path gives other bytes for 16+ float32 elements, the same under 16."""
    default, avx2 = isa_runs["default"]["randn"], isa_runs["avx2"]["randn"]
    if not _x86_avx2(isa_runs["avx2"]):
        pytest.skip("needs an x86 AVX2 CPU")
    big = [k for k in default if k.startswith("float32/") and int(k.split("/")[2]) >= 1000]
    assert big and all(default[k] != avx2[k] for k in big)
    small = [k for k in default if k.startswith("float32/") and 0 <= int(k.split("/")[2]) < 16]
    assert small and all(default[k] == avx2[k] for k in small)


# ----------------------------------------------------------------------------- golden

#: sha256 of ``portable_randn((1, 4, 16, 16), torch.Generator().manual_seed(42))`` bytes, measured on an
#: AMD EPYC (x86-64, AVX2 kernel) with torch 2.14.1 and 2.11.0, where it equals ``torch.randn``'s own
#: bytes. Any other platform (ARM Mac, Windows, no AVX2) must reproduce it.
GOLDEN_1x4x16x16_SEED42 = "d8607ea4ae1d5a731e50f615a12d198e0a1531cfe4e48cac3d228e521fd969f8"


@pytest.mark.parametrize("backend", ["auto", "numpy"])
def test_golden_digest_reproduces_on_this_machine(backend):
    noise = portable_randn((1, 4, 16, 16), torch.Generator().manual_seed(42), backend=backend)
    assert _digest(noise) == GOLDEN_1x4x16x16_SEED42


# ----------------------------------------------------------------------------- independent reference


class _MT19937:
    """Pure-Python MT19937 seeded like ``at::mt19937`` (``init_genrand`` on the seed's low 32 bits)."""

    def __init__(self, seed: int) -> None:
        self.mt = [seed & 0xFFFFFFFF]
        for i in range(1, 624):
            self.mt.append((1812433253 * (self.mt[-1] ^ (self.mt[-1] >> 30)) + i) & 0xFFFFFFFF)
        self.index = 624

    def next(self) -> int:
        if self.index >= 624:
            mt = self.mt
            for i in range(624):
                y = (mt[i] & 0x80000000) | (mt[(i + 1) % 624] & 0x7FFFFFFF)
                mt[i] = mt[(i + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            self.index = 0
        y = self.mt[self.index]
        self.index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return y ^ (y >> 18)


def _r32(x: float) -> float:
    """Round a float64 to float32 (round to nearest even); innocuous after one +,-,*,sqrt of float32s."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def _fma_exact(a: float, b: float, c: float) -> float:
    """float32 ``a*b + c`` rounded once, from exact rationals."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    near = _r32(float(exact))
    cands = [near, _from_bits(_bits(near) + 1), _from_bits(_bits(near) - 1)] if near != 0 else [near]
    cands = [x for x in cands if math.isfinite(x)]
    return min(cands, key=lambda x: (abs(Fraction(x) - exact), _bits(x) & 1))


# avx_mathfun.h literals (the header's own decimal text)
LIT = {
    "SQRTHF": 0.707106781186547524,
    "q1": -2.12194440e-4,
    "q2": 0.693359375,
    "FOPI": 1.27323954473516,
    "DP1": -0.78515625,
    "DP2": -2.4187564849853515625e-4,
    "DP3": -3.77489497744594108e-8,
    "cos": [2.443315711809948e-005, -1.388731625493765e-003, 4.166664568298827e-002],
    "sin": [-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1],
    "log": [
        7.0376836292e-2,
        -1.1514610310e-1,
        1.1676998740e-1,
        -1.2420140846e-1,
        1.4249322787e-1,
        -1.6668057665e-1,
        2.0000714765e-1,
        -2.4999993993e-1,
        3.3333331174e-1,
    ],
}


def _ref_log(x: float) -> float:
    """``log256_ps`` for one lane, as compiled (FMA at the polynomial, ``y*z + e*q1`` and ``e*q2 + x``)."""
    x = max(x, _from_bits(0x00800000))
    bits = _bits(x)
    e = float((bits >> 23) - 127) + 1.0
    m = _from_bits((bits & 0x007FFFFF) | 0x3F000000)
    if m < _r32(LIT["SQRTHF"]):
        e -= 1.0
        m = _r32(m + m - 1.0)  # cephes: x + x - 1 (exact)
    else:
        m = m - 1.0
    z = _r32(m * m)
    y = _r32(LIT["log"][0])
    for p in LIT["log"][1:]:
        y = _fma_exact(y, m, _r32(p))
    y = _r32(y * m)
    y = _fma_exact(y, z, _r32(e * _r32(LIT["q1"])))
    y = _r32(y - z * 0.5)
    m = _r32(m + y)
    return _fma_exact(e, _r32(LIT["q2"]), m)


def _ref_sincos(x: float) -> tuple[float, float]:
    """``sincos256_ps`` for one lane ``x >= 0``, as compiled."""
    j = int(_r32(x * _r32(LIT["FOPI"])))
    j = (j + 1) & ~1
    y = float(j)
    for dp in ("DP1", "DP2", "DP3"):
        x = _fma_exact(y, _r32(LIT[dp]), x)
    z = _r32(x * x)
    c = _fma_exact(_r32(LIT["cos"][0]), z, _r32(LIT["cos"][1]))
    c = _fma_exact(c, z, _r32(LIT["cos"][2]))
    c = _r32(c * z)
    c = _fma_exact(c, z, -_r32(z * 0.5))
    c = _r32(c + 1.0)
    s = _fma_exact(_r32(LIT["sin"][0]), z, _r32(LIT["sin"][1]))
    s = _fma_exact(s, z, _r32(LIT["sin"][2]))
    s = _r32(s * z)
    s = _fma_exact(x, s, x)
    if (j & 2) == 0:
        sin_v, cos_v = s + 0.0, c + 0.0
    else:
        sin_v, cos_v = c + 0.0, 0.0 + s
    if j & 4:
        sin_v = -sin_v
    if ~(j - 2) & 4:
        cos_v = -cos_v
    return sin_v, cos_v


def _ref_chunk(u: list[float]) -> list[float]:
    out = [0.0] * 16
    two_pi = _r32(2.0 * math.pi)
    for k in range(8):
        radius = _r32(math.sqrt(_r32(-2.0 * _ref_log(_r32(1.0 - u[k])))))
        sin_v, cos_v = _ref_sincos(_r32(two_pi * u[k + 8]))
        out[k] = _r32(radius * cos_v) + 0.0
        out[k + 8] = _r32(radius * sin_v) + 0.0
    return out


def _reference_randn(n: int, seed: int) -> np.ndarray:
    """torch's AVX2 float32 ``normal_fill`` for ``n >= 16``, from first principles."""
    mt = _MT19937(seed)
    u = [(mt.next() & 0xFFFFFF) / 2.0**24 for _ in range(n + (16 if n % 16 else 0))]
    out = [0.0] * n
    for i in range(0, n - 15, 16):
        out[i : i + 16] = _ref_chunk(u[i : i + 16])
    if n % 16:
        out[n - 16 :] = _ref_chunk(u[n:])
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("backend", ["auto", "numpy"])
@pytest.mark.parametrize("n, seed", [(16, 0), (17, 1), (31, 42), (100, 7), (1000, 123456789), (4099, 5)])
def test_matches_independent_pure_python_reference(n, seed, backend):
    ours = portable_randn((n,), torch.Generator().manual_seed(seed), backend=backend).numpy()
    ref = _reference_randn(n, seed)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), (
        f"{int((ours.view(np.uint32) != ref.view(np.uint32)).sum())} of {n} differ"
    )


def test_reference_mt19937_is_torchs_stream():
    mt = _MT19937(42)
    words = [mt.next() & 0xFFFFFF for _ in range(1000)]
    expected = (torch.rand(1000, generator=torch.Generator().manual_seed(42)) * 2**24).to(torch.int64).tolist()
    assert words == expected


def test_constants_are_the_float32_roundings_of_the_header_literals():
    as32 = np.float32
    assert pr._SQRTHF == as32(LIT["SQRTHF"]) and pr._FOPI == as32(LIT["FOPI"])
    assert pr._LOG_Q1 == as32(LIT["q1"]) and pr._LOG_Q2 == as32(LIT["q2"])
    assert list(pr._LOG_P) == [as32(v) for v in LIT["log"]]
    assert list(pr._DP) == [as32(LIT[k]) for k in ("DP1", "DP2", "DP3")]
    assert list(pr._COS_P) == [as32(v) for v in LIT["cos"]]
    assert list(pr._SIN_P) == [as32(v) for v in LIT["sin"]]
    assert pr._TWO_PI == as32(2.0 * math.pi)


@pytest.mark.parametrize("fma", ["exact", "fast"])
def test_fma_emulation_is_correctly_rounded_including_double_rounding_ties(fma):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(3000).astype(np.float32)
    b = rng.standard_normal(3000).astype(np.float32)
    c = (-(a * b) * (1 + rng.standard_normal(3000) * 1e-3)).astype(np.float32)  # heavy cancellation
    # a*b + c lands exactly on a float32 midpoint in float64 while the exact value is off it
    # (naive float64 then float32 rounds the wrong way: ties-to-even picks the even neighbour)
    a_t = np.float32(-(2.0**-24) * (1 + 2.0**-23))
    b_t = np.float32(1 - 2.0**-23)
    c_t = np.float32(1 + 3 * 2.0**-23)
    assert np.float32(np.float64(a_t) * np.float64(b_t) + np.float64(c_t)) == np.float32(1 + 2.0**-22)  # naive
    a = np.concatenate([a, [a_t, -a_t]]).astype(np.float32)
    b = np.concatenate([b, [b_t, b_t]]).astype(np.float32)
    c = np.concatenate([c, [c_t, np.float32(1 + 2.0**-23)]]).astype(np.float32)
    got = pr._fma(a, b, c) if fma == "exact" else pr._FastFMA(a.shape)(a, b, c)
    want = np.array([_fma_exact(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)], dtype=np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert got[-2] == np.float32(1 + 3 * 2.0**-23) and got[-1] == np.float32(1 + 2.0**-23)


# ----------------------------------------------------------------------------- in-process behaviour


@pytest.mark.parametrize("backend", ["auto", "numpy"])
def test_generator_advances_exactly_like_torch_randn(backend):
    """The mt19937 stream and the cached-sample flag follow torch; the cached float64 sample itself is
    ours (correctly rounded) and may differ from the libm one in its last bit, never as float32."""
    y = slice(pr._NORMAL_Y, pr._NORMAL_Y + 8)
    # torch <= 2.11 draws half types with another algorithm (one uniform per element): float32 only there
    dtypes = pr.PORTABLE_DTYPES if _torch_at_least(torch.__version__, (2, 14)) else (torch.float32,)
    for dtype in dtypes:
        g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        for n in (5, 33, 1, 16, 7, 100, 3):  # odd small draws leave a cached sample in the state
            portable_randn((n,), g1, dtype=dtype, backend=backend)
            torch.randn(n, generator=g2, dtype=dtype)
            s1, s2 = g1.get_state(), g2.get_state()
            assert torch.equal(s1[: y.start], s2[: y.start]) and torch.equal(s1[y.stop :], s2[y.stop :]), (dtype, n)
            c1, c2 = (struct.unpack("<d", bytes(s[y].numpy()))[0] for s in (s1, s2))
            assert np.float32(c1) == np.float32(c2) and abs(c1 - c2) <= abs(math.ulp(c2)), (dtype, n)


def test_shape_dtype_and_empty():
    g = torch.Generator().manual_seed(0)
    out = portable_randn((2, 4, 3, 5), g, dtype=torch.bfloat16)
    assert out.shape == (2, 4, 3, 5) and out.dtype == torch.bfloat16 and out.is_contiguous()
    state = g.get_state()
    assert portable_randn((1, 0, 4), g).shape == (1, 0, 4)
    assert torch.equal(g.get_state(), state)  # an empty draw consumes nothing, as in torch


def test_small_path_matches_torch_scalar_path_on_many_draws():
    """Under 16 elements torch uses libm in float64 (same code on every ISA); ours rounds correctly."""
    g1, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    ours = torch.cat([portable_randn((15,), g1) for _ in range(400)])
    theirs = torch.cat([torch.randn(15, generator=g2) for _ in range(400)])
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))


def test_box_muller_extremes_are_finite():
    """u = 0 (log 1 = 0: radius 0, +0 not -0) and the largest uniform 1 - 2**-24 (largest radius)."""
    chunk = np.zeros((1, 16), dtype=np.float32)
    chunk[0, 1] = np.float32(1 - 2.0**-24)
    chunk[0, 9] = np.float32(1 - 2.0**-24)
    out = box_muller_avx2(chunk)
    assert np.all(np.isfinite(out))
    assert out[0, 0] == 0 and not np.signbit(out[0, 0]) and not np.signbit(out[0, 8])
    assert 5.5 < abs(float(out[0, 1])) + abs(float(out[0, 9]))


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        portable_randn((4,), torch.Generator(), dtype=torch.float64)
    with pytest.raises(ValueError):
        portable_randn((-1, 4), torch.Generator())
    with pytest.raises(TypeError):
        portable_randn((4,), None)


# ----------------------------------------------------------------------------- routing torch.randn


def test_routing_happens_only_where_it_changes_bits():
    """x86 AVX2/AVX512: torch's float32 bytes are the portable ones, so ``torch.randn`` is not replaced."""
    routed = route.routed_dtypes()
    assert (torch.float32 in routed) == (not pr.torch_draws_portable(torch.float32))
    original = torch.randn
    with route.portable_generator_randn():
        assert (torch.randn is original) == (not routed)
    assert torch.randn is original
    record = route.route_record()
    assert set(record) == {"float32", "float16", "bfloat16"}
    if pr.torch_draws_portable(torch.float32):
        assert record["float32"].startswith("torch.randn (portable")


@pytest.fixture
def force_route(monkeypatch):
    """Route every portable dtype, as on a CPU without AVX2 (to test the replacement itself on any CPU)."""
    monkeypatch.setattr(route, "routed_dtypes", lambda: pr.PORTABLE_DTYPES)


def test_generator_randn_routing_is_scoped_and_selective(force_route):
    original = torch.randn
    torch.manual_seed(0)
    global_draw = torch.randn(100)
    with route.portable_generator_randn():
        with route.portable_generator_randn():  # re-entrant
            routed = torch.randn(3, 40, generator=torch.Generator().manual_seed(8))
            routed_kw = torch.randn(
                size=(3, 40),
                generator=torch.Generator().manual_seed(8),
                device="cpu",
                dtype=torch.float32,
                layout=torch.strided,
            )
            torch.manual_seed(0)
            global_inside = torch.randn(100)  # no generator: torch's own path, untouched
            double = torch.randn(40, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
        assert torch.randn is not original
    assert torch.randn is original
    expected = portable_randn((3, 40), torch.Generator().manual_seed(8), backend="numpy")
    assert torch.equal(routed, expected) and torch.equal(routed_kw, expected)
    assert torch.equal(global_inside, global_draw)
    assert torch.equal(double, torch.randn(40, generator=torch.Generator().manual_seed(8), dtype=torch.float64))
    with pytest.raises(RuntimeError):
        with route.portable_generator_randn():
            raise RuntimeError("boom")
    assert torch.randn is original


def test_torchsde_brownian_draws_are_routed(force_route):
    bi = pytest.importorskip("torchsde._brownian.brownian_interval")
    with route.portable_generator_randn():
        assert torch.randn is route._routed_randn
        draw = bi._randn((4, 16, 16), torch.float32, torch.device("cpu"), 77)
    assert torch.equal(draw, portable_randn((4, 16, 16), torch.Generator().manual_seed(77), backend="numpy"))


BROWNIAN_SCRIPT = textwrap.dedent(
    """
    import hashlib, sys
    import torch
    sys.path.insert(0, sys.argv[1])
    import comfy.cli_args
    comfy.cli_args.args.cpu = True
    from comfy.k_diffusion.sampling import BrownianTreeNoiseSampler
    sys.path.insert(0, sys.argv[2])
    from _steadfast_import import import_steadfast
    import_steadfast()
    from steadfast.core.determinism.randn_route import portable_generator_randn
    x = torch.zeros(2, 4, 16, 16)
    sig = torch.tensor([14.6, 9.1, 5.3, 2.9, 1.4, 0.6, 0.2, 0.03])  # literal: torch.linspace is ISA-dependent
    def steps():
        ns = BrownianTreeNoiseSampler(x, sig.min(), sig.max(), seed=[5, 6], cpu=True)  # per-item trees
        return torch.stack([ns(sig[i], sig[i + 1]) for i in range(7)])
    digest = lambda t: hashlib.sha256(t.numpy().tobytes()).hexdigest()
    with portable_generator_randn():
        routed = digest(steps())
    print(torch.backends.cpu.get_cpu_capability(), routed, digest(steps()))
    """
)


@pytest.mark.comfyui
def test_comfyui_brownian_tree_noise_is_isa_independent_when_routed():
    comfy = Path(os.environ.get("COMFYUI_PATH", Path.home() / "comfy" / "ComfyUI")).expanduser()
    if not (comfy / "comfy" / "k_diffusion" / "sampling.py").is_file():
        pytest.skip(f"ComfyUI NOT FOUND at {comfy}: the Brownian-tree routing is NOT verified in this run")
    pytest.importorskip("torchsde")
    runs = {}
    for isa in ("avx2", "default"):
        proc = subprocess.run(
            [sys.executable, "-c", BROWNIAN_SCRIPT, str(comfy), str(REPO / "scripts")],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "ATEN_CPU_CAPABILITY": isa},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[isa] = proc.stdout.split()[-3:]
    assert runs["default"][0] == "DEFAULT"
    assert runs["avx2"][1] == runs["default"][1]  # routed: the same steps on both ISAs
    if runs["avx2"][0] not in ("AVX2", "AVX512"):
        pytest.skip(
            f"no AVX2 torch kernel on this machine ({runs['avx2'][0]}): the routed steps are the same on "
            "both ISAs (checked above) but are NOT compared with torch's own AVX2 bytes here"
        )
    assert runs["avx2"][1] == runs["avx2"][2]  # and torch's own AVX2 bytes
    assert runs["default"][2] != runs["avx2"][2]  # unrouted, torch's default path differs
