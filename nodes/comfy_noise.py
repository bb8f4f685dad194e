"""How the running ComfyUI draws KSampler's initial noise, asked of ComfyUI itself (not copied from one version).

``batch_seed_mode="comfy"`` promises noise bit-identical to stock KSampler's ``comfy.sample.prepare_noise``.
ComfyUI changed it between the tested versions: 0.8.0's ``prepare_noise_inner`` calls ``torch.randn`` in the
latent's dtype, 0.33.0's draws ``torch.float32`` and casts to the latent's dtype (``comfy/sample.py``). For a
float32 latent the two agree; for fp16/bf16 they do not. So the Seeded Sampler asks the running ComfyUI once
per dtype, by drawing a small probe with its real function and comparing the bytes with the two known ways,
drawn the way the pack will draw them (:func:`comfy_draw` with the pack's ``portable_randn``).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

import comfy.sample

# Torch's vectorised (>= 16 elements) path with and without a tail: on torch 2.14.1 half-precision randn equals
# float32-then-cast for whole multiples of 16 elements and differs in the tail (torch 2.11.0 differs everywhere),
# so a probe without a tail could not tell the two ways apart.
_PROBE_SHAPES = ((1, 4, 25, 10), (1, 4, 16, 16))


class UnknownComfyNoiseError(RuntimeError):
    """The running ComfyUI draws noise in neither known way: ``comfy`` mode cannot promise KSampler's bytes."""


def _running_comfy_noise(probe: torch.Tensor, seed: int) -> torch.Tensor:
    inner = getattr(comfy.sample, "prepare_noise_inner", None)
    if inner is not None:  # both 0.8.0 and 0.33.0: takes a generator, so the global RNG is left alone
        return inner(probe, torch.Generator(device="cpu").manual_seed(seed))
    with torch.random.fork_rng():  # prepare_noise reseeds the global RNG (torch.manual_seed)
        return comfy.sample.prepare_noise(probe, seed)


def _torch_draw(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype, generator=generator)


def _match(latent_dtype: torch.dtype, draw: Callable) -> torch.dtype | None | bool:
    """The candidate (``None``: the latent's dtype, or float32) whose ``draw`` equals ComfyUI's on every probe."""
    refs = [_running_comfy_noise(torch.zeros(shape, dtype=latent_dtype), 0) for shape in _PROBE_SHAPES]
    for candidate in (None, torch.float32):
        ours = [draw(shape, candidate or latent_dtype, torch.Generator(device="cpu").manual_seed(0)).to(latent_dtype)
                for shape in _PROBE_SHAPES]
        if all(r.dtype == o.dtype and torch.equal(r.view(torch.uint8), o.view(torch.uint8))
               for r, o in zip(refs, ours)):
            return candidate
    return False


@functools.cache
def comfy_draw(latent_dtype: torch.dtype, draw: Callable | None = None) -> tuple[torch.dtype | None, bool]:
    """How the running ComfyUI draws ``latent_dtype`` noise, and whether ``draw`` reproduces it here.

    Compares ComfyUI's own ``prepare_noise`` with the draw the caller will actually make (``draw``: the pack's
    :func:`core.determinism.randn.portable_randn`), in the latent's dtype and in float32 then cast; if neither
    matches (the pack's portable bytes differ from this torch's own: a CPU without AVX2, ARM, or half types on
    a torch 2.11 ComfyUI that draws in the latent's dtype), ComfyUI's way is learned from ``torch.randn`` and
    reported as not bit-identical.

    Args:
        latent_dtype: the latent's dtype.
        draw: ``draw(shape, dtype, generator) -> tensor`` (CPU); ``None``: ``torch.randn``.
    Returns:
        ``(draw_dtype, bit_identical)``: ``draw_dtype`` is ``None`` (ComfyUI draws in ``latent_dtype``) or
        ``torch.float32`` (it draws float32 and casts); ``bit_identical`` says whether ``draw`` gives
        ComfyUI's bytes here.
    Raises:
        UnknownComfyNoiseError: the running ComfyUI's noise equals neither way even with ``torch.randn``.
    """
    found = _match(latent_dtype, draw or _torch_draw)
    if found is not False:
        return found, True
    if draw is not None:
        found = _match(latent_dtype, _torch_draw)
        if found is not False:
            return found, False
    raise UnknownComfyNoiseError(
        f"this ComfyUI's comfy.sample.prepare_noise draws {latent_dtype} noise in a way Steadfast does not know "
        "(neither in the latent's dtype nor float32 then cast): batch_seed_mode 'comfy' cannot promise KSampler's "
        "bytes here. Use batch_seed_mode 'incremental', or a float32 latent.")


def draw_dtype(latent_dtype: torch.dtype) -> torch.dtype | None:
    """The dtype the running ComfyUI draws ``latent_dtype`` noise in: ``None`` (that dtype) or ``torch.float32``.

    Learned against ``torch.randn``; :func:`comfy_draw` also says whether the pack's own draw matches.

    Args:
        latent_dtype: the latent's dtype (``torch.float32``, ``torch.float16``, ``torch.bfloat16``, ...).
    Returns:
        ``None`` when ComfyUI draws in ``latent_dtype`` (ComfyUI 0.8.0, and every version for float32), or
        ``torch.float32`` when it draws float32 and casts (ComfyUI 0.33.0); pass it to
        ``core.determinism.noise.seeded_noise(..., draw_dtype=...)``.
    Raises:
        UnknownComfyNoiseError: the running ComfyUI's noise equals neither way for this dtype.
    """
    return comfy_draw(latent_dtype)[0]
