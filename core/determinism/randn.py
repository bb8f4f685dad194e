"""Portable ``torch.randn``: the bytes torch's AVX2 CPU kernel gives, on every platform.

Why: ``torch.randn(..., generator=cpu_gen)`` for 16 or more float32 elements runs a Box-Muller transform
whose log/sin/cos depend on the CPU build (``aten/src/ATen/native/cpu/``):

- ``DistributionTemplates.h`` ``normal_fill`` with ``NormalFill16<float>`` (``normal_fill_AVX2`` in older
  torch, the same math): under ``CPU_CAPABILITY_AVX2`` the 16-element
  Box-Muller uses ``log256_ps`` and ``sincos256_ps`` from ``avx_mathfun.h`` (Julien Pommier's cephes
  polynomials, compiled with FMA contraction); elsewhere (``ATEN_CPU_CAPABILITY=default``, ARM, other
  ISAs) the scalar template calls the platform libm's ``logf``/``cosf``/``sinf``.
- ``DistributionKernels.cpp`` registers ``normal_stub`` with ``REGISTER_NO_AVX512_DISPATCH``, so an AVX512
  CPU runs the AVX2 kernel.

So the same seed gives one noise on x86 PCs (AVX2 or AVX512) and another on Apple silicon. This module
reproduces the AVX2 kernel's output bit for bit with operations whose rounding IEEE 754 fixes (numpy
float32 ``+ - *`` and ``sqrt``, float64 ``+ - *``, and from those an exactly rounded fused multiply-add),
drawn from the same generator stream: x86 seeds keep their pictures, other platforms get the x86 picture.
``torch.sqrt`` is not used: on the CPU it is not correctly rounded (docs/benchmarks.md section 21).

Algorithm (``normal_fill``, float32, ``n >= 16`` elements, mean 0, std 1):

1. ``u[i] = (mt19937() & 0xFFFFFF) * 2**-24`` for ``i < n`` (``uniform_real_distribution<float>``,
   ``core/TransformationHelper.h`` ``uniform_real``), plus 16 more when ``n % 16 != 0``. ``torch.rand``
   draws exactly these (``uniform_kernel``, one ``random()`` per element, serial on every ISA).
2. Each full 16-chunk ``c`` gives ``r = sqrt(-2 log(1 - c[j]))``, ``t = 2pi * c[j + 8]``,
   ``out[j] = r cos t``, ``out[j + 8] = r sin t`` for ``j < 8``.
3. When ``n % 16 != 0`` the 16 extra uniforms form one more chunk that overwrites ``out[n-16:]``.

Source: ``avx_mathfun.h`` and the disassembly of ``NormalFill16<float, true>::operator()`` in
``libtorch_cpu.so`` (x86-64 wheels).

Fewer than 16 elements (or float16/bfloat16 in torch <= 2.11) go through other torch code: see
:func:`portable_randn`. Noise drawn inside code the pack does not own (torchsde, diffusers) reaches
:func:`portable_randn` through the one process-wide route, :mod:`.randn_route`.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "PORTABLE_DTYPES",
    "box_muller_avx2",
    "draw_method",
    "portable_randn",
    "torch_draws_portable",
    "torch_half_uses_float32_kernel",
]

#: dtypes :func:`portable_randn` draws: float32, and float16/bfloat16 the way torch 2.14 draws them.
PORTABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _f32(bits: int) -> np.float32:
    return np.frombuffer(struct.pack("<I", bits), dtype=np.float32)[0]


# Constants of avx_mathfun.h (cephes), as the float32 bit patterns found in libtorch_cpu.so; each equals
# the float32 rounding of the decimal literal in the header (tests/core/test_portable_randn.py checks).
_ONE = np.float32(1.0)
_TWO_PI = _f32(0x40C90FDB)  # (float)(2.0 * c10::pi<double>)
_MIN_NORM = 0x00800000  # smallest normal float32
_SQRTHF = _f32(0x3F3504F3)  # cephes_SQRTHF 0.707106781186547524
_LOG_P = tuple(
    _f32(b)
    for b in (  # cephes_log_p0 .. p8
        0x3D9021BB,
        0xBDEBD1B8,
        0x3DEF251A,
        0xBDFE5D4F,
        0x3E11E9BF,
        0xBE2AAE50,
        0x3E4CCEAC,
        0xBE7FFFFC,
        0x3EAAAAAA,
    )
)
_LOG_Q1 = _f32(0xB95E8083)  # cephes_log_q1 -2.12194440e-4
_LOG_Q2 = _f32(0x3F318000)  # cephes_log_q2 0.693359375
_FOPI = _f32(0x3FA2F983)  # cephes_FOPI 4/pi
_DP = (_f32(0xBF490000), _f32(0xB97DA000), _f32(0xB3222169))  # minus_cephes_DP1..DP3
_COS_P = (_f32(0x37CCF5CE), _f32(0xBAB6061A), _f32(0x3D2AAAA5))  # coscof_p0..p2
_SIN_P = (_f32(0xB94CA1F9), _f32(0x3C08839E), _f32(0xBE2AAAA3))  # sincof_p0..p2


def _fma(a: np.ndarray, b, c) -> np.ndarray:
    """float32 ``a * b + c`` rounded once (what ``vfmadd*ps`` computes), on any platform.

    ``a * b`` is exact in float64 (24 + 24 bits), so ``s = a*b + c`` in float64 is the exact value ``v``
    rounded once. Rounding ``s`` to float32 gives the correctly rounded ``v`` unless ``s`` is exactly
    halfway between two float32 values while ``v`` is not (no float32 midpoint lies strictly between
    ``v`` and ``s``: it would be a float64 nearer to ``v``). Those rare ties are settled from the exact
    error of the sum (TwoSum): the result is rounded towards ``v``, i.e. rounding to odd (Boldo &
    Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to
    odd", IEEE TC 2008).

    Args:
        a: float32 array. b: float32 scalar, or array of float32 values (dtype float32 or float64).
        c: float32 scalar or float32 array (broadcastable).
    Returns:
        float32 array of the broadcast shape.
    """
    s = a.astype(np.float64)
    s *= b if np.ndim(b) == 0 or b.dtype == np.float64 else b.astype(np.float64)
    p = s.copy()
    s += c  # float32/float64 arrays or scalars: exact inputs
    tie = (s.view(np.int64) & 0x1FFFFFFF) == 0x10000000  # halfway between two float32 values
    if tie.any():
        idx = np.nonzero(tie)
        pt, ct, st = p[idx], np.broadcast_to(np.asarray(c, dtype=np.float64), s.shape)[idx], s[idx]
        bb = st - pt
        err = (pt - (st - bb)) + (ct - bb)  # TwoSum: v = st + err exactly
        s.view(np.int64)[idx] += (np.sign(err) * np.sign(st)).astype(np.int64)  # towards v: no tie
    return s.astype(np.float32)


def _log256(x: np.ndarray, fma=_fma) -> np.ndarray:
    """``log256_ps`` (``avx_mathfun.h``) as compiled in torch's AVX2 kernel, for ``x > 0`` (float32).

    ``fma``: the fused multiply-add emulation (:func:`_fma`, or a :class:`_FastFMA` that flags ties)."""
    xi = np.maximum(x, _f32(_MIN_NORM)).view(np.int32)
    e = ((xi >> 23) - 127).astype(np.float32) + _ONE
    m = ((xi & 0x007FFFFF) | 0x3F000000).view(np.float32)  # mantissa in [0.5, 1)
    small = m < _SQRTHF
    e = e - np.where(small, _ONE, np.float32(0))
    m = (m + np.float32(-1.0)) + np.where(small, m, np.float32(0))  # exact (Sterbenz)
    z = m * m
    m64 = m.astype(np.float64)
    y = np.full_like(m, _LOG_P[0])
    for p in _LOG_P[1:]:
        y = fma(y, m64, p)  # vfmadd132ps
    y = y * m
    y = fma(y, z, e * _LOG_Q1)  # y*z + e*q1 contracted
    y = y - z * np.float32(0.5)  # vfnmadd: z*0.5 is exact
    m = m + y
    return fma(e, _LOG_Q2, m)  # e*q2 + x contracted


def _sincos256(x: np.ndarray, fma=_fma) -> tuple[np.ndarray, np.ndarray]:
    """``sincos256_ps`` (``avx_mathfun.h``) as compiled in torch's AVX2 kernel (float32, ``0 <= x < 8192``).

    ``fma``: as in :func:`_log256`."""
    xi = x.view(np.int32)
    sign_sin = xi & np.int32(-0x80000000)
    x = (xi & 0x7FFFFFFF).view(np.float32)
    j = (x * _FOPI).astype(np.int32)  # cvttps2dq: truncation
    j = (j + 1) & ~np.int32(1)
    y = j.astype(np.float32)
    sign_sin = sign_sin ^ ((j & 4) << 29)
    sign_cos = (~(j - 2) & 4) << 29
    poly_mask = (j & 2) == 0
    for dp in _DP:  # x = ((x - y*DP1) - y*DP2) - y*DP3, fused
        x = fma(y, dp, x)
    z = x * x
    z64 = z.astype(np.float64)
    c = fma(np.full_like(z, _COS_P[0]), z64, _COS_P[1])
    c = fma(c, z64, _COS_P[2])
    c = c * z
    c = fma(c, z64, -(z * np.float32(0.5)))  # vfmsub: y*z - z*0.5
    c = c + _ONE
    s = fma(np.full_like(z, _SIN_P[0]), z64, _SIN_P[1])
    s = fma(s, z64, _SIN_P[2])
    s = s * z
    s = fma(x, s, x)  # y2*x + x contracted
    zero = np.float32(0)
    s_part = np.where(poly_mask, s, zero)  # and/andnot selects, then the adds
    c_part = np.where(poly_mask, zero, c)
    sin_v = c_part + s_part
    cos_v = (c - c_part) + (s - s_part)
    sin_v = (sin_v.view(np.int32) ^ sign_sin).view(np.float32)
    cos_v = (cos_v.view(np.int32) ^ sign_cos).view(np.float32)
    return sin_v, cos_v


class _FastFMA:
    """:func:`_fma` on reused scratch buffers (no temporaries over the whole block but the result).

    The same arithmetic as :func:`_fma`: the float64 product is exact, the sum is rounded once, and the sums
    that sit exactly halfway between two float32 values are settled from their exact error (TwoSum), computed
    for those lanes only (the product is recomputed there instead of copied for every lane).

    Args:
        shape: the lane shape of every array operand (one block).
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.s = np.empty(shape, dtype=np.float64)
        self.low = np.empty(shape, dtype=np.int64)
        self.hit = np.empty(shape, dtype=bool)

    def __call__(self, a: np.ndarray, b, c) -> np.ndarray:
        s = self.s
        np.multiply(a, b, out=s, dtype=np.float64)  # exact: 24 x 24 bits
        np.add(s, c, out=s)  # one float64 rounding
        np.bitwise_and(s.view(np.int64), 0x1FFFFFFF, out=self.low)
        np.equal(self.low, 0x10000000, out=self.hit)  # halfway between two float32 values?
        if self.hit.any():
            idx = np.nonzero(self.hit)
            pt = a[idx].astype(np.float64) * (b if np.ndim(b) == 0 else np.asarray(b)[idx].astype(np.float64))
            ct = c if np.ndim(c) == 0 else np.asarray(c)[idx]
            st = s[idx]
            bb = st - pt
            err = (pt - (st - bb)) + (ct - bb)  # TwoSum: v = st + err exactly
            s.view(np.int64)[idx] += (np.sign(err) * np.sign(st)).astype(np.int64)  # towards v: no tie
        return s.astype(np.float32)


_BLOCK_ROWS = 2048  # 16 Ki lanes of float64 temporaries per block: 128 KiB, fits a core's L2


def box_muller_avx2(chunks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """torch's AVX2 ``NormalFill16<float>`` on rows of 16 uniforms (mean 0, std 1).

    Args:
        chunks: float32 array ``[k, 16]`` of uniforms in ``[0, 1)``.
        out: optional float32 array ``[k, 16]`` to write into (no copy of the result).
    Returns:
        float32 array ``[k, 16]`` (``out`` when given): ``r*cos`` in columns 0-7, ``r*sin`` in columns 8-15.
    """
    chunks = np.ascontiguousarray(chunks, dtype=np.float32)
    if out is None:
        out = np.empty_like(chunks)
    for i in range(0, chunks.shape[0], _BLOCK_ROWS):  # cache-sized blocks
        block = chunks[i : i + _BLOCK_ROWS]
        u1 = _ONE - block[:, :8]
        theta = block[:, 8:] * _TWO_PI
        fma = _FastFMA(u1.shape)
        log_u1, (sin_v, cos_v) = _log256(u1, fma), _sincos256(theta, fma)
        radius = np.sqrt(log_u1 * np.float32(-2.0))  # IEEE sqrt (torch.sqrt is not exact)
        dest = out[i : i + _BLOCK_ROWS]
        np.multiply(radius, cos_v, out=dest[:, :8])
        np.multiply(radius, sin_v, out=dest[:, 8:])
    out += np.float32(0)  # fmadd(n, std=1, mean=0): -0 -> +0
    return out


# CPUGeneratorImplState (aten/src/ATen/CPUGeneratorImpl.cpp): legacy_pod.normal_y and
# legacy_pod.normal_is_valid hold the cached second sample of normal_distribution<double>.
_STATE_SIZE = 5056
_NORMAL_Y = 5024
_NORMAL_VALID = 5040


def _round53(value) -> float:
    """An mpmath value rounded to nearest float64."""
    import mpmath

    with mpmath.workprec(53):
        return float(+value)


def _scalar_normals(n: int, generator: torch.Generator) -> np.ndarray:
    """``n < 16`` samples of torch's scalar path, with correctly rounded log1p/sin/cos.

    ``normal_kernel`` (``DistributionTemplates.h``) draws small tensors element by element with
    ``at::normal_distribution<double>`` (``core/DistributionsHelper.h``): a cached sample if the generator
    holds one, else two ``random64()`` uniforms ``u1, u2``, ``r = sqrt(-2 log1p(-u2))``,
    ``t = 2pi u1``, return ``r cos t`` and cache ``r sin t``. torch calls libm there; here log1p, sin and
    cos are evaluated at 120 bits and rounded to nearest float64 (mpmath), the rest in float64.

    Returns:
        float64 array ``[n]``; the generator's stream and its cached sample advance as torch's would.
    Raises:
        RuntimeError: the generator state has an unknown layout.
    """
    import mpmath

    state = generator.get_state()
    if state.numel() != _STATE_SIZE:
        raise RuntimeError(f"unknown CPU generator state layout ({state.numel()} bytes, expected {_STATE_SIZE})")
    raw = bytes(state.numpy())
    out: list[float] = []
    if struct.unpack_from("<i", raw, _NORMAL_VALID)[0]:
        out.append(struct.unpack_from("<d", raw, _NORMAL_Y)[0])
    pairs = (n - len(out) + 1) // 2
    uniforms = torch.rand(2 * pairs, dtype=torch.float64, generator=generator).tolist() if pairs else []
    cached = None
    with mpmath.workprec(120):
        for k in range(pairs):
            u1, u2 = uniforms[2 * k], uniforms[2 * k + 1]
            radius = math.sqrt(-2.0 * _round53(mpmath.log1p(mpmath.mpf(-u2))))
            theta = (2.0 * math.pi) * u1
            out.append(radius * _round53(mpmath.cos(mpmath.mpf(theta))))
            sample = radius * _round53(mpmath.sin(mpmath.mpf(theta)))
            if len(out) < n:
                out.append(sample)
            else:
                cached = sample
    new = bytearray(bytes(generator.get_state().numpy()))
    struct.pack_into("<d", new, _NORMAL_Y, cached if cached is not None else 0.0)
    struct.pack_into("<i", new, _NORMAL_VALID, 1 if cached is not None else 0)
    generator.set_state(torch.frombuffer(new, dtype=torch.uint8).clone())
    return np.asarray(out, dtype=np.float64) + 0.0  # val * std + mean: -0 -> +0


def _check_args(shape: Sequence[int], generator: torch.Generator, dtype: torch.dtype) -> tuple[int, ...]:
    if dtype not in PORTABLE_DTYPES:
        raise ValueError(f"portable_randn draws {[str(d) for d in PORTABLE_DTYPES]}, not {dtype}")
    if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
        raise TypeError(f"generator must be a CPU torch.Generator, got {generator!r}")
    dims = tuple(int(s) for s in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {dims}")
    return dims


def _numpy_randn(dims: tuple[int, ...], n: int, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """The emulation (any CPU): ``n >= 16`` elements through :func:`box_muller_avx2`."""
    tail = n % 16
    full = n - tail
    # float32 draws all n uniforms, then 16 for the last chunk; half types (opmath_t buffer) draw
    # only the full chunks' uniforms, then 16 for the last chunk (normal_fill, torch 2.14).
    drawn = (n if dtype == torch.float32 else full) + (16 if tail else 0)
    uniforms = torch.rand(drawn, generator=generator).numpy()
    values = np.empty(n, dtype=np.float32)
    box_muller_avx2(uniforms[:full].reshape(-1, 16), out=values[:full].reshape(-1, 16))
    if tail:
        values[n - 16 :] = box_muller_avx2(uniforms[drawn - 16 :].reshape(1, 16)).reshape(-1)
    out = torch.from_numpy(values).reshape(dims)
    return out if dtype == torch.float32 else out.to(dtype)


def _half_from_float32_kernel(
    dims: tuple[int, ...], n: int, generator: torch.Generator, dtype: torch.dtype
) -> torch.Tensor:
    """torch 2.14's half-precision ``normal_fill`` built from torch's own float32 kernel (``n >= 16``).

    The full 16-chunks are ``torch.randn(full)`` (float32, no tail: exactly ``full`` uniforms, one
    Box-Muller per chunk) and the overwriting last chunk is ``torch.randn(16)`` on the next 16 uniforms.
    Equal to :func:`_numpy_randn` wherever torch's float32 kernel is (:func:`torch_draws_portable`).
    """
    tail = n % 16
    full = n - tail
    values = torch.empty(n, dtype=torch.float32)
    _TORCH_RANDN(full, generator=generator, out=values[:full])
    if tail:
        values[n - 16 :] = _TORCH_RANDN(16, generator=generator)
    return values.reshape(dims).to(dtype)


#: ``torch.randn`` as imported (the probe and the fast path never see the routed replacement).
_TORCH_RANDN = torch.randn
#: probe sizes: a vectorised draw with a 7-element tail (the overwriting last chunk) and one without.
_PROBE_SIZES = (16 * 1024 + 7, 16 * 64)
_PROBE_SEEDS = (20231126, 2**64 - 1)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@functools.cache
def torch_draws_portable(dtype: torch.dtype) -> bool:
    """Whether this process's ``torch.randn`` on a CPU generator gives :func:`portable_randn`'s bytes.

    Checked once per dtype (cached) on probes of ``16*1024 + 7`` and ``16*64`` elements from two seeds,
    against the numpy emulation. True on x86-64 builds whose float32 kernel is AVX2 or AVX512 (and, for
    float16/bfloat16, on a torch that draws them through that kernel: 2.14, not 2.11); False on ARM,
    ``ATEN_CPU_CAPABILITY=default`` or CPUs without AVX2.

    Args:
        dtype: one of :data:`PORTABLE_DTYPES`.
    Returns:
        bool.
    """
    return _torch_randn_equals(_numpy_randn, dtype)


def _torch_randn_equals(build, dtype: torch.dtype) -> bool:
    """Whether ``torch.randn`` gives the same bytes as ``build(shape, numel, generator, dtype)`` for every probe
    (:data:`_PROBE_SEEDS` x :data:`_PROBE_SIZES`: sizes with a tail past the 16-element vector path)."""
    for seed in _PROBE_SEEDS:
        for n in _PROBE_SIZES:
            theirs = _TORCH_RANDN(n, generator=torch.Generator().manual_seed(seed), dtype=dtype)
            if not _same_bytes(theirs, build((n,), n, torch.Generator().manual_seed(seed), dtype)):
                return False
    return True


@functools.cache
def torch_half_uses_float32_kernel(dtype: torch.dtype) -> bool:
    """Whether this torch draws ``dtype`` (float16/bfloat16) through its float32 Box-Muller (torch 2.14).

    torch 2.11 draws half types with another algorithm (one 11-/8-bit uniform per element, libm), on every
    ISA; torch 2.14 runs the float32 ``normal_fill`` on float32 uniforms and casts. Checked once (cached) by
    comparing ``torch.randn(dtype)`` with the same draw built from torch's float32 kernel.
    """
    return _torch_randn_equals(_half_from_float32_kernel, dtype)


def draw_method(dtype: torch.dtype) -> str:
    """How :func:`portable_randn` draws 16+ elements of ``dtype`` in this process (same bytes every way).

    Returns:
        ``"torch.randn"`` (torch's kernel gives the portable bytes here), ``"torch.randn float32 chunks"``
        (half types on a torch whose own half draw differs, built from its float32 kernel) or ``"numpy"``
        (the emulation: ARM, no AVX2, ``ATEN_CPU_CAPABILITY=default``).
    """
    if torch_draws_portable(dtype):
        return "torch.randn"
    if dtype != torch.float32 and torch_draws_portable(torch.float32):
        return "torch.randn float32 chunks"
    return "numpy"


def portable_randn(
    shape: Sequence[int], generator: torch.Generator, dtype: torch.dtype = torch.float32, *, backend: str = "auto"
) -> torch.Tensor:
    """Like ``torch.randn(shape, generator=generator, dtype=dtype)`` on the CPU, the same bytes everywhere.

    For 16 or more elements the result equals torch's AVX2 kernel (x86-64 builds, AVX2 or AVX512 CPUs),
    whatever CPU or ``ATEN_CPU_CAPABILITY`` runs it; the generator advances exactly as ``torch.randn``
    advances it, so draws before and after stay in step with torch.

    Where torch's own kernel already gives these bytes (checked once per process and dtype on a probe with
    a tail: :func:`torch_draws_portable`), the draw *is* ``torch.randn`` (no tax on x86 AVX2/AVX512); half
    types on a torch whose half draw differs are built from its float32 kernel; elsewhere the numpy
    emulation (:func:`box_muller_avx2`) draws them (:func:`draw_method` says which).

    Args:
        shape: the output shape (any number of dimensions, 0-size allowed).
        generator: a CPU ``torch.Generator``; consumed as ``torch.randn`` consumes it.
        dtype: ``torch.float32`` (default), ``torch.float16`` or ``torch.bfloat16``. Half types follow
            torch 2.14's ``normal_fill``: the float32 Box-Muller on float32 uniforms, cast down, except
            that a partial last chunk is not drawn before the 16 uniforms of the overwriting chunk (so
            for ``n % 16 != 0`` it is not ``portable_randn(float32).to(dtype)``). torch 2.11 drew half
            types with another, libm-based scalar algorithm on every ISA (``normal_fill<scalar_t>`` on
            11-/8-bit uniforms), which this does not reproduce.
        backend: ``"auto"`` (default: the fastest way that gives the portable bytes here) or ``"numpy"``
            (always the emulation; for tests and benchmarks).
    Returns:
        Contiguous CPU tensor of ``shape`` and ``dtype``. Under 16 elements: torch's scalar
        ``normal_distribution<double>`` path (the same code on every ISA) with correctly rounded
        log1p/sin/cos, then cast through float32; equal to torch wherever the platform libm's
        float64 results round to the same float32 (docs/benchmarks.md section 21).
    Raises:
        ValueError: ``dtype`` not in :data:`PORTABLE_DTYPES`, a negative dimension, or an unknown ``backend``.
        TypeError: ``generator`` is not a CPU ``torch.Generator``.
    """
    dims = _check_args(shape, generator, dtype)
    if backend not in ("auto", "numpy"):
        raise ValueError(f"backend must be 'auto' or 'numpy', got {backend!r}")
    n = math.prod(dims)
    if n == 0:
        return torch.empty(dims, dtype=dtype)
    if n < 16:
        values = _scalar_normals(n, generator).astype(np.float32)
        out = torch.from_numpy(values).reshape(dims)
        return out if dtype == torch.float32 else out.to(dtype)
    method = "numpy" if backend == "numpy" else draw_method(dtype)
    if method == "torch.randn":
        return _TORCH_RANDN(dims, generator=generator, dtype=dtype)
    if method == "torch.randn float32 chunks":
        return _half_from_float32_kernel(dims, n, generator, dtype)
    return _numpy_randn(dims, n, generator, dtype)
