"""Seeded, device-independent noise that never touches the global RNG.

All noise is drawn on the CPU from private ``torch.Generator`` objects, so it is the same on every
machine and leaves ``torch.get_rng_state()`` untouched (ComfyUI's ``comfy.sample.prepare_noise``
reseeds the *global* generator via ``torch.manual_seed``: ComfyUI 0.8.0 ``comfy/sample.py``).

A private CPU generator seeded with ``torch.Generator().manual_seed(seed)`` produces the same stream
as the default CPU generator after ``torch.manual_seed(seed)`` (``torch.manual_seed`` seeds the
default CPU generator with exactly that call, plus the accelerators), which is what makes the
``"comfy"`` mode bit-identical to ComfyUI.

Every draw goes through :func:`core.determinism.randn.portable_randn` (float32/float16/bfloat16): the
bytes torch's AVX2 CPU kernel gives, on any CPU (x86 with or without AVX2/AVX512, ARM, Windows), so a
seed gives the same noise on a Mac as on a PC, and on x86 the same as ``torch.randn``. Where
torch's own kernel gives those bytes (x86 AVX2/AVX512, checked once per process) the draw is ``torch.randn``
itself, so reproducibility costs nothing there.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Literal

import torch

from .randn import PORTABLE_DTYPES, portable_randn

__all__ = ["MAX_SEED", "NOISE_MODES", "CPUNoiseSampler", "check_seed", "draw", "item_seeds", "seeded_noise"]

NOISE_MODES = ("incremental", "comfy")
#: Largest seed ComfyUI's seed widgets allow and ``torch.Generator.manual_seed`` takes: ``2**64 - 1``.
MAX_SEED = 0xFFFF_FFFF_FFFF_FFFF


def check_seed(seed: object, *, count: int = 1, name: str = "seed") -> int:
    """``seed`` as a Python ``int``, checked so that ``seed .. seed + count - 1`` are all valid seeds.

    The one seed check of the pack (noise, determinism policies, pipeline generators). ``count`` is the
    number of consecutive seeds the caller derives (``seed + i`` per batch item); ``name`` names the
    argument in the messages. Accepts ``int`` and NumPy integers, not ``bool``.

    Raises:
        TypeError: ``seed`` is not an integer. ValueError: ``seed < 0`` or ``seed + count - 1`` above
            :data:`MAX_SEED` (``2**64 - 1``), or ``count < 1``.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{name} must be in [0, 2**64 - 1], got {seed}")
    if seed + count - 1 > MAX_SEED:
        raise ValueError(f"{name} + batch index exceeds 2**64 - 1 ({name}={seed}, {count} seeds)")
    return seed


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _randn(shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """The pack's one noise draw: :func:`portable_randn` (same bytes on every CPU) for float32/16/bf16.

    Other dtypes (float64) fall back to ``torch.randn``, whose bytes depend on the platform's libm.
    """
    if dtype in PORTABLE_DTYPES:
        return portable_randn(shape, generator, dtype=dtype)
    return torch.randn(tuple(shape), dtype=dtype, generator=generator)


def draw(shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """One CPU draw exactly as :func:`seeded_noise` makes it (``draw(shape, dtype, generator)``), e.g. for probes.

    Args:
        shape: output shape. dtype: float32/float16/bfloat16 (portable) or another float dtype (``torch.randn``).
        generator: a CPU ``torch.Generator``, advanced as ``torch.randn`` advances it.
    Returns:
        CPU tensor of ``shape`` and ``dtype``.
    """
    return _randn(tuple(shape), dtype, generator)


def _check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    try:
        dims = tuple(int(s) for s in shape)
    except TypeError as exc:
        raise ValueError(f"shape must be a sequence of ints, got {shape!r}") from exc
    if len(dims) not in (4, 5):
        raise ValueError(f"noise shape must be 4-D [B,C,H,W] or 5-D [B,C,T,H,W], got {dims}")
    if dims[0] < 1:
        raise ValueError(f"noise shape has an empty batch: {dims}")
    if any(d < 1 for d in dims[1:]):
        raise ValueError(f"noise shape has an empty dimension: {dims}")
    return dims


def _check_batch_index(batch_index: Sequence[int] | None, batch: int) -> list[int] | None:
    if batch_index is None:
        return None
    inds = [int(i) for i in batch_index]
    if len(inds) != batch:
        raise ValueError(f"batch_index has {len(inds)} entries for a batch of {batch}")
    if any(i < 0 for i in inds):
        raise ValueError(f"batch_index entries must be >= 0, got {inds}")
    return inds


def item_seeds(
    seed: int, batch: int, mode: str = "incremental", batch_index: Sequence[int] | None = None
) -> list[int]:
    """The seed of each batch item: the pack's one "item ``i`` = ``seed + i``".

    Used wherever a batch derives its seeds: initial noise (:func:`seeded_noise`), per-step noise
    (:class:`CPUNoiseSampler` ``per_item``), a pipeline's CPU generators (``core.pipelines.run.image_generators``)
    and the run record's ``seeds``.

    Args:
        seed: seed of item 0, an integer in ``[0, 2**64 - 1]``.
        batch: number of items, >= 1.
        mode: ``"incremental"``: item ``j`` gets ``seed + k`` with ``k = batch_index[j]`` (default ``k = j``),
            so item ``j`` equals a batch-1 run at that seed. ``"comfy"``: ComfyUI's one stream for the whole
            batch, seeded once: every item lists ``seed`` (``batch_index`` is checked, not used).
        batch_index: optional per-item indices (``latent["batch_index"]``), one per item, each >= 0.
    Returns:
        ``batch`` Python ints, in batch order.
    Raises:
        TypeError: ``seed`` is not an integer. ValueError: ``batch < 1``, unknown ``mode``, a ``batch_index`` of
            the wrong length or with negative entries, or a seed outside ``[0, 2**64 - 1]`` (:func:`check_seed`).
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    seed = check_seed(seed)
    if mode not in NOISE_MODES:
        raise ValueError(f"mode must be one of {NOISE_MODES}, got {mode!r}")
    inds = _check_batch_index(batch_index, batch)
    if mode == "comfy":
        return [seed] * batch
    offsets = inds if inds is not None else range(batch)
    check_seed(seed, count=max(offsets) + 1)
    return [seed + k for k in offsets]


def seeded_noise(
    shape: Sequence[int],
    seed: int,
    *,
    mode: Literal["incremental", "comfy"] = "incremental",
    dtype: torch.dtype = torch.float32,
    batch_index: Sequence[int] | None = None,
    draw_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Standard-normal noise of ``shape`` on the CPU, from private generators only.

    Args:
        shape: 4-D ``[B,C,H,W]`` or 5-D ``[B,C,T,H,W]`` latent shape, every dimension >= 1.
        seed: integer in ``[0, 2**64 - 1]`` (ComfyUI's seed range).
        mode:
            ``"incremental"``: item ``j`` is drawn from its own generator seeded ``seed + k`` with
            ``k = batch_index[j]`` (default ``k = j``), so item ``j`` equals a batch-1 call at
            ``seed + k``: changing the batch size never changes the other items.
            ``"comfy"``: bit-identical to ``comfy.sample.prepare_noise(latent, seed, batch_index)``
            for a plain tensor latent of this shape/dtype (one stream for the whole batch; with
            ``batch_index``, item ``j`` is the ``batch_index[j]``-th batch-1 draw of that stream),
            but without reseeding the global RNG. "Bit-identical" holds where ComfyUI's own
            ``torch.randn`` runs torch's AVX2 kernel (x86-64 CPUs with AVX2 or AVX512) and, for
            noise drawn in float16/bfloat16 (``draw_dtype`` None), on torch >= 2.14; elsewhere this gives the
            x86 noise and ComfyUI does not.
        dtype: dtype of the returned noise (the latent's dtype).
        batch_index: optional per-item indices (``latent["batch_index"]``), one per batch item, >= 0.
        draw_dtype: dtype the values are drawn in before the cast to ``dtype``; ``None`` draws in
            ``dtype``. Drawing fp16 is not the same as drawing fp32 and casting, and ComfyUI changed
            which it does: 0.8.0's ``prepare_noise_inner`` draws in the latent's dtype, 0.33.0's draws
            ``torch.float32`` and casts. ``"comfy"`` callers pass what the running ComfyUI does
            (``nodes/host/noise.py`` asks it).
    Returns:
        ``torch.Tensor`` of ``shape`` and ``dtype`` on the CPU, contiguous.
    Raises:
        ValueError: bad shape (not 4-/5-D, empty batch or dimension), seed out of range (negative,
            or ``seed + index`` above ``2**64 - 1`` in incremental mode), unknown mode, or a
            ``batch_index`` of the wrong length / with negative entries.
        TypeError: ``seed`` is not an int.
    """
    dims = _check_shape(shape)
    seed = check_seed(seed)
    if mode not in NOISE_MODES:
        raise ValueError(f"mode must be one of {NOISE_MODES}, got {mode!r}")
    inds = _check_batch_index(batch_index, dims[0])
    item_shape = (1, *dims[1:])
    draw = dtype if draw_dtype is None else draw_dtype

    def randn(size, generator):
        return _randn(size, draw, generator).to(dtype)

    if mode == "incremental":
        items = [randn(item_shape, _generator(s)) for s in item_seeds(seed, dims[0], mode, inds)]
        return torch.cat(items, dim=0)

    generator = _generator(seed)
    if inds is None:
        return randn(dims, generator)
    # The stream is consumed one batch-1 draw at a time up to the largest index requested. A single
    # [max+1, ...] draw is not the same in general (docs/benchmarks.md section 21).
    wanted = set(inds)
    kept: dict[int, torch.Tensor] = {}
    for k in range(max(inds) + 1):
        item = randn(item_shape, generator)
        if k in wanted:
            kept[k] = item
    return torch.cat([kept[k] for k in inds], dim=0)


def _device_of(*values: object, default: torch.device) -> torch.device:
    """The device of the first tensor among ``values`` (ComfyUI's ``sigma``s live with ``x``), else ``default``."""
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
    return default


class CPUNoiseSampler:
    """Per-step noise for ancestral/SDE samplers, drawn on the CPU from a private generator.

    ``sampler(sigma, sigma_next)`` returns standard-normal noise shaped like ``x_like``, drawn in
    ``x_like.dtype`` on the CPU with :func:`portable_randn` (the same bytes on every CPU) and handed over on the
    device of the ``sigma`` it is called with: ComfyUI's samplers call ``noise_sampler(sigmas[i], sigmas[i+1])``
    with ``sigmas`` on the device of ``x`` (``comfy/samplers.py`` ``outer_sample`` moves both to the model's
    load device), while the LATENT the node builds the sampler from stays on the CPU. Without a tensor
    argument the noise goes to ``x_like.device``. The sequence of calls is fully determined by ``seed`` and
    is the same on every device; the global RNG is never used.

    Handing over to a CUDA device goes through one of two pinned host buffers and a non-blocking copy (the
    GPU does not wait on a pageable copy), and the next step's draw is prepared on a background thread while
    the current step runs (``prefetch``). The draws are the same, in the same order, as synchronous ones:
    one worker thread, each draw waits for the previous one.

    Compatibility: ComfyUI's ``k_diffusion.sampling.default_noise_sampler`` draws on the latent's
    device and, on the CPU, seeds its generator with ``seed + 1``; so for a CPU latent
    ``CPUNoiseSampler(x, seed + 1)`` reproduces ComfyUI's CPU ancestral noise.

    Args:
        x_like: tensor whose shape and dtype the noise takes (any number of dimensions; at least 1-D with
            ``per_item``); its device is the fallback target.
        seed: integer in ``[0, 2**64 - 1]``.
        per_item: one generator per batch item, item ``i`` seeded ``seed + i`` (pairs with
            ``seeded_noise(mode="incremental")``: item ``i``'s per-step noise then equals a batch-1
            run at ``seed + i``). Default False: one stream for the whole batch, like ComfyUI.
        prefetch: draw the next step's noise on a background thread after each call. ``None`` (default):
            only when the noise goes to a device other than the CPU (on the CPU the draw would compete with
            the model for the same cores).
    Raises:
        TypeError / ValueError: bad ``x_like`` or ``seed`` (or ``seed + i`` above ``2**64 - 1``).
    """

    def __init__(
        self, x_like: torch.Tensor, seed: int, *, per_item: bool = False, prefetch: bool | None = None
    ) -> None:
        if not isinstance(x_like, torch.Tensor):
            raise TypeError(f"x_like must be a torch.Tensor, got {type(x_like).__name__}")
        self.seed = check_seed(seed)
        self.shape = tuple(x_like.shape)
        self.dtype = x_like.dtype
        self.device = x_like.device
        self.per_item = bool(per_item)
        self.prefetch = prefetch
        if self.per_item:
            if len(self.shape) == 0 or self.shape[0] < 1:
                raise ValueError(f"per_item needs a non-empty batch dimension, got shape {self.shape}")
            self.generators = [_generator(s) for s in item_seeds(self.seed, self.shape[0])]
        else:
            self.generators = [_generator(self.seed)]
        self.calls = 0
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._pinned: list[torch.Tensor] = []
        self._copied: list[object] = [None, None]  # CUDA events: the copy out of each pinned buffer is done
        self._slot = 0

    def _draw(self) -> torch.Tensor:
        if self.per_item:
            item_shape = (1, *self.shape[1:])
            return torch.cat([_randn(item_shape, self.dtype, g) for g in self.generators], dim=0)
        return _randn(self.shape, self.dtype, self.generators[0])

    def _next_on_cpu(self, prefetch: bool) -> torch.Tensor:
        """The next draw of the stream: the prefetched one if any, and start the one after when asked."""
        if self._pending is not None:
            noise, self._pending = self._pending.result(), None
        else:
            noise = self._draw()
        if prefetch:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steadfast-noise")
            self._pending = self._executor.submit(self._draw)
        return noise

    def _to_cuda(self, noise: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``noise`` on ``device`` through a pinned buffer and a non-blocking copy on the current stream."""
        if not self._pinned:
            self._pinned = [torch.empty(self.shape, dtype=self.dtype, pin_memory=True) for _ in range(2)]
        slot, self._slot = self._slot, 1 - self._slot
        if self._copied[slot] is not None:
            self._copied[slot].synchronize()  # the copy out of this buffer, two steps ago, has finished
        buf = self._pinned[slot]
        buf.copy_(noise)
        out = buf.to(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self._copied[slot] = event
        return out

    def __call__(self, sigma: object = None, sigma_next: object = None) -> torch.Tensor:
        """Next noise tensor, on the device of ``sigma`` (or ``sigma_next``; else ``x_like``'s).

        ``sigma``/``sigma_next`` only say where the noise goes (the values are unused).
        """
        self.calls += 1
        target = _device_of(sigma, sigma_next, default=self.device)
        prefetch = self.prefetch if self.prefetch is not None else target.type != "cpu"
        noise = self._next_on_cpu(prefetch)
        if target.type == "cpu":
            return noise
        if target.type == "cuda":
            return self._to_cuda(noise, target)
        return noise.to(target)

    def close(self) -> None:
        """Stop the prefetch thread (a prefetched draw is dropped). Also done when the sampler is collected."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor, self._pending = None, None

    def __del__(self) -> None:
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
