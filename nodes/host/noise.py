"""How the running ComfyUI draws KSampler's noise: initial noise asked of ComfyUI itself, per-step noise by a table.

``batch_seed_mode="comfy"`` promises noise bit-identical to stock KSampler's ``comfy.sample.prepare_noise``.
ComfyUI changed it between the tested versions: 0.8.0's ``prepare_noise_inner`` calls ``torch.randn`` in the
latent's dtype, 0.33.0's draws ``torch.float32`` and casts to the latent's dtype (``comfy/sample.py``). For a
float32 latent the two agree; for fp16/bf16 they do not. So the Seeded Sampler asks the running ComfyUI once
per dtype, by drawing a small probe with its real function and comparing the bytes with the two known ways,
drawn the way the pack will draw them (:func:`comfy_draw` with the pack's ``portable_randn``).

Per-step noise (ancestral, SDE, CFG++ samplers) is dispatched by :data:`PER_STEP_NOISE`, an explicit table keyed
by the k-diffusion sampler function's name: what ComfyUI draws when it is handed no ``noise_sampler``.
:func:`per_step_noise` picks the noise sampler the Seeded Sampler hands ComfyUI from it.
``tests/comfy/test_noise_table.py`` holds the table to the running ComfyUI by calling every sampler of
``KSampler.SAMPLERS`` with recording noise samplers on a stand-in denoiser.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch

import comfy.sample

# Torch's vectorised (>= 16 elements) path with and without a tail: half-precision randn can equal float32-then-cast
# for whole multiples of 16 elements and differ in the tail (docs/benchmarks.md section 21), so a probe without a
# tail could not tell the two ways apart.
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
        ours = [
            draw(shape, candidate or latent_dtype, torch.Generator(device="cpu").manual_seed(0)).to(latent_dtype)
            for shape in _PROBE_SHAPES
        ]
        if all(
            r.dtype == o.dtype and torch.equal(r.view(torch.uint8), o.view(torch.uint8)) for r, o in zip(refs, ours)
        ):
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
        "bytes here. Use batch_seed_mode 'incremental', or a float32 latent."
    )


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


DEFAULT, BROWNIAN, NONE = "default", "brownian", "none"
#: How ComfyUI's samplers draw their per-step noise when no ``noise_sampler`` is handed, by the sampler function's
#: ``__name__`` (``comfy.samplers.sampler_object(name).sampler_function``; ComfyUI 0.8.0 and 0.33.0 agree):
#:
#: * ``"default"``: ``comfy.k_diffusion.sampling.default_noise_sampler(x, seed)``, one generator on the *sampling
#:   device* over the whole batch (the output depends on the device and on the batch);
#: * ``"brownian"``: a ``BrownianTreeNoiseSampler`` seeded once for the whole batch (on the CPU, or on ``x``'s
#:   device for the ``_gpu`` twins);
#: * ``"none"``: no per-step noise (a handed noise sampler is never called).
#:
#: ``tests/comfy/test_noise_table.py`` checks every row against the running ComfyUI (which noise sampler it builds,
#: whether a handed one is called) and that every ``KSampler.SAMPLERS`` name's function is a row.
PER_STEP_NOISE: dict[str, str] = {
    # default_noise_sampler(x, seed=...) when noise_sampler is None
    "sample_euler_ancestral": DEFAULT,
    "sample_euler_ancestral_cfg_pp": DEFAULT,
    "sample_dpm_2_ancestral": DEFAULT,
    "sample_dpmpp_2s_ancestral": DEFAULT,
    "sample_dpmpp_2s_ancestral_cfg_pp": DEFAULT,
    "sample_exp_heun_2_x0_sde": DEFAULT,
    "sample_ddpm": DEFAULT,
    "sample_lcm": DEFAULT,
    "sample_er_sde": DEFAULT,
    "sample_seeds_2": DEFAULT,
    "sample_seeds_3": DEFAULT,
    "sample_sa_solver": DEFAULT,
    "sample_sa_solver_pece": DEFAULT,
    "sample_res_multistep": DEFAULT,
    "sample_res_multistep_cfg_pp": DEFAULT,  # built, eta=0: never called
    "sample_res_multistep_ancestral": DEFAULT,
    "sample_res_multistep_ancestral_cfg_pp": DEFAULT,
    # BrownianTreeNoiseSampler(x, sigma_min, sigma_max, seed=..., cpu=True) (_gpu twins: cpu=False)
    "sample_dpmpp_sde": BROWNIAN,
    "sample_dpmpp_sde_gpu": BROWNIAN,
    "sample_dpmpp_2m_sde": BROWNIAN,
    "sample_dpmpp_2m_sde_gpu": BROWNIAN,
    "sample_dpmpp_2m_sde_heun": BROWNIAN,  # builds its tree inside sample_dpmpp_2m_sde
    "sample_dpmpp_2m_sde_heun_gpu": BROWNIAN,
    "sample_dpmpp_3m_sde": BROWNIAN,
    "sample_dpmpp_3m_sde_gpu": BROWNIAN,
    # no per-step noise
    "sample_euler": NONE,
    "sample_euler_cfg_pp": NONE,
    "sample_heun": NONE,
    "sample_heunpp2": NONE,
    "sample_exp_heun_2_x0": NONE,
    "sample_dpm_2": NONE,
    "sample_lms": NONE,
    "dpm_fast_function": NONE,
    "dpm_adaptive_function": NONE,  # comfy.samplers' closures over k-diffusion's
    "sample_dpmpp_2m": NONE,
    "sample_dpmpp_2m_cfg_pp": NONE,
    "sample_ipndm": NONE,
    "sample_ipndm_v": NONE,
    "sample_deis": NONE,
    "sample_gradient_estimation": NONE,
    "sample_gradient_estimation_cfg_pp": NONE,
    "sample_unipc": NONE,
    "sample_unipc_bh2": NONE,  # uni_pc, uni_pc_bh2 (comfy/extra_samplers/uni_pc.py)
}
#: Samplers whose step control couples the items of a batch, by the sampler function's ``__name__``, with why:
#: item i's result depends on the other items, so no per-item evaluation of the model can make item i equal the
#: batch-1 run. Under Determinism Setup's ``batch_invariant`` the Seeded Sampler (``incremental``) samples each
#: item of such a sampler alone (:func:`couples_items`). ``tests/comfy/test_sampler_matrix.py`` checks every other
#: sampler of ``KSampler.SAMPLERS`` keeps its items apart.
COUPLED_ITEMS: dict[str, str] = {
    "dpm_adaptive_function": "its step-size control measures the error over the whole batch (one norm over every "
    "item), so each item's steps depend on the other items",
}


def noise_kind(sampler) -> str:
    """How the Seeded Sampler treats a sampler's per-step noise: ``"none"``, ``"brownian"`` or ``"default"``.

    ``"default"``: ComfyUI draws from ``default_noise_sampler``, a generator on the *sampling device* over the
    whole batch, so the output depends on the device and on the batch: the pack hands a per-item CPU noise sampler.
    ``"brownian"``: a ``BrownianTreeNoiseSampler`` seeded once for the whole batch: in ``incremental`` mode the pack
    hands one tree per item (seed + i), drawn on the CPU.

    Args:
        sampler: ``comfy.samplers.KSAMPLER`` (from ``sampler_object``); anything without a
            ``sampler_function`` is ``"none"``.
    Returns:
        The :data:`PER_STEP_NOISE` row of ``sampler.sampler_function.__name__``. A function ComfyUI does not ship
        (another node pack's) is ``"default"`` when it takes a ``noise_sampler`` argument, else ``"none"``.
    """
    fn = getattr(sampler, "sampler_function", None)
    return NONE if fn is None else _kind_of(inspect.unwrap(fn))


def _ships_with_comfy(fn) -> bool:
    """Whether ``fn`` is one of ComfyUI's own sampler functions that :data:`PER_STEP_NOISE` describes."""
    return getattr(fn, "__name__", "") in PER_STEP_NOISE and str(getattr(fn, "__module__", "")).startswith("comfy.")


def couples_items(sampler) -> str | None:
    """Why the items of a batch cannot be sampled together and each equal its batch-1 run, or ``None``.

    Args:
        sampler: ``comfy.samplers.KSAMPLER`` (from ``sampler_object``); anything without a ``sampler_function``
            couples nothing.
    Returns:
        The :data:`COUPLED_ITEMS` reason for ComfyUI's coupled samplers (``dpm_adaptive``); for a function
        ComfyUI does not ship (another node pack's, or one newer than :data:`PER_STEP_NOISE`) a reason too: the
        pack cannot vouch that it keeps items apart. ``None`` for ComfyUI's other samplers.
    """
    fn = getattr(sampler, "sampler_function", None)
    if fn is None:
        return None
    fn = inspect.unwrap(fn)
    name = getattr(fn, "__name__", "")
    if name in COUPLED_ITEMS:
        return COUPLED_ITEMS[name]
    if not _ships_with_comfy(fn):
        return (
            f"{name or 'this sampler'} is not one of the ComfyUI samplers Steadfast knows, so nothing says its "
            "step control keeps the items of a batch apart"
        )
    return None


@functools.cache
def _kind_of(fn) -> str:
    if _ships_with_comfy(fn):
        return PER_STEP_NOISE[fn.__name__]
    try:
        takes = "noise_sampler" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    return DEFAULT if takes else NONE


class PerStepNoise:
    """The pack's per-step noise sampler, built from ComfyUI's ``x`` when sampling starts, as ComfyUI builds its own.

    ComfyUI's ``default_noise_sampler(x)`` and Brownian tree draw in ``x.dtype``, and ``x`` is what ComfyUI samples
    in: float32 on ComfyUI 0.33.0 (``outer_sample`` casts noise and latent), the LATENT's dtype on 0.8.0. So the
    noise sampler is built by :meth:`bind` from ``x`` itself (:func:`bind_to_x` makes the sampler function call it);
    called before any :meth:`bind` (a caller that hands ``x`` to nobody), it is built from ``like``.

    Args:
        build: ``build(x) -> noise sampler`` (``noise_sampler(sigma, sigma_next) -> noise``).
        like: the tensor to build from when :meth:`bind` was never called (the LATENT's samples).
    """

    def __init__(self, build: Callable, like: torch.Tensor) -> None:
        self._build, self._like, self.inner = build, like, None

    def bind(self, x: torch.Tensor):
        """Build the noise sampler from ``x`` (its shape and dtype) unless built already; returns it."""
        if self.inner is None:
            self.inner = self._build(x)
        return self.inner

    def __call__(self, sigma=None, sigma_next=None) -> torch.Tensor:
        return self.bind(self._like)(sigma, sigma_next)

    def close(self) -> None:
        """Stop what the built noise sampler runs (a prefetch thread), if anything."""
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


def bind_to_x(sampler, noise_sampler: PerStepNoise) -> None:
    """Make ``sampler``'s function build ``noise_sampler`` from the ``x`` ComfyUI hands it (its second argument).

    Args:
        sampler: the ``comfy.samplers.KSAMPLER`` this run samples with (its own object: ``sampler_object``);
            ``sampler_function`` is replaced by a wrapper with the same name, module and signature.
        noise_sampler: the :class:`PerStepNoise` handed to it as ``noise_sampler``.
    """
    fn = sampler.sampler_function

    @functools.wraps(fn)
    def sampling(model, x, *args, **kwargs):
        noise_sampler.bind(x)
        return fn(model, x, *args, **kwargs)

    sampler.sampler_function = sampling


def check_run_seed(
    sampler, seed: int, batch: int, mode: str, device: torch.device | str, batch_index=None, item_by_item: bool = False
) -> int:
    """The one seed-range check of a Seeded Sampler run: every seed it derives (initial and per-step noise).

    Item ``k``'s initial noise uses ``seed + k`` (``incremental``, ``k`` from ``batch_index``); per-step noise uses
    ``seed + 1`` (+ the item) where ComfyUI's CPU ``default_noise_sampler`` does, ``seed`` + the item for a
    per-item Brownian tree. Why: a seed near ``2**64 - 1`` is refused up front, not later on ``seed + 1`` with a
    message about another number.

    Args:
        sampler: ``comfy.samplers.KSAMPLER`` (from ``sampler_object``).
        seed: the node's seed. batch: the LATENT's batch size. mode: ``"incremental"`` or ``"comfy"``.
        device: where the model samples (``comfy`` mode: ComfyUI's own noise off the CPU, seeded ``seed``).
        batch_index: the LATENT's ``batch_index`` (or ``None``).
        item_by_item: each item sampled alone at its own seed (:func:`couples_items`).
    Returns:
        ``seed`` as an ``int``.
    Raises:
        TypeError: ``seed`` is not an integer.
        ValueError: ``seed`` is negative, or a derived seed exceeds ``2**64 - 1``: the message names what
            derives it and the largest seed this run accepts.
    """
    from ...core.determinism import noise  # here: tests/core/test_noise.py loads this file alone, no package

    seed = noise.check_seed(seed)
    offsets = [int(k) for k in batch_index] if batch_index is not None else list(range(batch))
    last = max(offsets) if mode == "incremental" else 0
    uses = [
        (last, f"the initial noise of item {offsets.index(last)} (seed + {last})" if last else "the initial noise")
    ]
    kind = noise_kind(sampler)
    name = getattr(getattr(sampler, "sampler_function", None), "__name__", "this sampler")
    if mode == "incremental" and kind != NONE:
        top = max(offsets) if item_by_item else batch - 1
        plus = 1 if kind == DEFAULT else 0
        uses.append(
            (
                top + plus,
                f"the per-step noise of {name} (seed{' + 1' if plus else ''} + the item, up to seed + {top + plus})",
            )
        )
    elif mode == "comfy" and kind == DEFAULT and torch.device(device).type == "cpu":
        uses.append((1, f"the per-step noise of {name} (ComfyUI seeds its CPU noise generator with seed + 1)"))
    offset, what = max(uses, key=lambda u: u[0])
    if seed + offset > noise.MAX_SEED:
        raise ValueError(
            f"seed {seed} is too large for this run: {what} would exceed 2**64 - 1. Use a seed of "
            f"at most {noise.MAX_SEED - offset} (2**64 - 1 - {offset})."
        )
    return seed


def per_item_brownian(latent: torch.Tensor, sigmas: torch.Tensor, seed: int):
    """One CPU Brownian tree per item, seeded ``seed + i`` (item i then equals a batch-1 run at seed + i).

    Args:
        latent: ComfyUI's ``x`` (or the LATENT's samples), ``[B, ...]``: the noise's shape and dtype, as
            ComfyUI's own tree takes them from ``x``.
        sigmas: the schedule; its smallest positive and its largest value bound the tree.
        seed: the node's seed.
    Returns:
        ComfyUI's ``BrownianTreeNoiseSampler`` over ``B`` trees (its draw moves to ``sigma``'s device).
    """
    from comfy.k_diffusion.sampling import BrownianTreeNoiseSampler

    from ...core.determinism.noise import (
        item_seeds,  # here: tests load this module on its own (tests/core/test_noise.py)
    )

    positive = sigmas[sigmas > 0]
    return BrownianTreeNoiseSampler(
        latent, positive.min(), sigmas.max(), seed=item_seeds(seed, latent.shape[0]), cpu=True
    )


def per_step_noise(sampler, latent: torch.Tensor, sigmas: torch.Tensor, seed: int, mode: str, device: torch.device):
    """The per-step noise sampler the Seeded Sampler hands ``sampler`` (or ``None``: ComfyUI's own), and its name.

    Args:
        sampler: ``comfy.samplers.KSAMPLER`` from ``sampler_object``.
        latent: the LATENT's samples (ComfyUI keeps them on the CPU). The noise sampler is built from ComfyUI's
            ``x`` when :func:`bind_to_x` binds it (the dtype ComfyUI samples in: float32 on 0.33.0, whatever the
            LATENT's; the LATENT's own on 0.8.0), from ``latent`` when nothing binds it.
        sigmas: the schedule (its min/max bound a Brownian tree).
        seed: the node's seed. mode: ``"incremental"`` or ``"comfy"``.
        device: where the model samples (``model.load_device``: ComfyUI moves ``x`` and ``sigmas`` there).
    Returns:
        ``(noise_sampler or None, description)``: a :class:`PerStepNoise` or ``None``. Each returns its noise on the
        device of the
        ``sigma`` it is called with (ComfyUI calls ``noise_sampler(sigmas[i], sigmas[i + 1])``):
        :class:`~...core.determinism.noise.CPUNoiseSampler` follows ``sigma``, ComfyUI's ``BatchedBrownianTree``
        moves its CPU draw to ``t0.device``.

    ``comfy`` mode keeps ComfyUI's own noise sampler wherever KSampler's per-step noise is not the CPU's:
    ``default_noise_sampler`` draws from a generator on ``x``'s device seeded ``seed`` (``seed + 1`` only on
    the CPU: ``comfy/k_diffusion/sampling.py``, 0.8.0 and 0.33.0), which only that device can reproduce, and
    every Brownian tree (ComfyUI's own tree, seeded once for the batch).
    """
    from ...core.determinism import noise  # here: tests/core/test_noise.py loads this file alone, no package

    kind = noise_kind(sampler)
    if kind == DEFAULT:
        if mode == "incremental":
            # seed + 1: ComfyUI's CPU default stream, so a batch-1 CPU run equals KSampler's
            return PerStepNoise(lambda x: noise.CPUNoiseSampler(x, seed + 1, per_item=True), latent), "cpu"
        if torch.device(device).type == "cpu":  # = KSampler's CPU generator (seed + 1)
            return PerStepNoise(lambda x: noise.CPUNoiseSampler(x, seed + 1), latent), "cpu"
        return None, f"comfy default_noise_sampler on {device} (seed {seed})"
    if kind == BROWNIAN and mode == "incremental":
        return PerStepNoise(lambda x: per_item_brownian(x, sigmas, seed), latent), "cpu brownian tree per item"
    return None, "sampler default"
