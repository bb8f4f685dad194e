"""Steadfast Seeded Sampler: KSampler with device-independent seeded noise and a run record."""

from __future__ import annotations

import time

import torch

import comfy.model_management
import comfy.sample
import comfy.samplers
import comfy.utils
import latent_preview
from comfy_api.v0_0_2 import io

from ..core.determinism import noise, portable, randn_route, torch_state
from ..core.optimize import attention as sdpa
from ..core.record import run_record
from .host import identity
from .host import noise as host_noise
from .outputs import with_run_record
from .patches.compile import compile_state
from .patches.options import SteadfastOptions, steadfast_options
from .patches.qkv import qkv_counters

BATCH_SEED_MODES = ["incremental", "comfy"]


def _attention_of(opts: SteadfastOptions) -> str:
    """The attention that ran: Optimize Model's SDPA backend, else SDPA pinned by batch invariance, else ComfyUI's."""
    if opts.attention is not None:
        return opts.attention
    if isinstance(opts.batch_invariant, dict):
        return "pytorch_sdpa:auto (pinned by batch_invariant: ComfyUI's own choice chunks by free memory)"
    return "comfy default"


def _dtype_of(model) -> str:
    """The diffusion model's weight dtype, plus the compute dtype when it differs (``manual_cast_dtype``)."""
    weights = str(model.model.get_dtype())
    cast = model.get_model_object("manual_cast_dtype")
    return weights if cast is None or str(cast) == weights else f"{weights} (compute {cast})"


class HalfLatentError(RuntimeError):
    """A sampler that fails on a half-precision LATENT where ComfyUI samples in the LATENT's dtype (0.8.0)."""


def _item_masks(mask: torch.Tensor | None, batch: int) -> list[torch.Tensor | None]:
    """Item ``i``'s ``noise_mask`` as ComfyUI would give it to item ``i`` of the batch (``prepare_mask``: reshaped
    to ``[-1, 1, h, w]`` and repeated to the batch size)."""
    if mask is None:
        return [None] * batch
    rows = comfy.utils.repeat_to_batch_size(mask.reshape((-1, 1, mask.shape[-2], mask.shape[-1])), batch)
    return [rows[i : i + 1] for i in range(batch)]


def _check_item_conds(positive, negative, batch: int, sampler_name: str) -> None:
    """Refuse item-by-item sampling when a conditioning tensor carries several rows (they spread over the batch).

    Raises:
        ValueError: naming the sampler and the fix.
    """
    for name, cond in (("positive", positive), ("negative", negative)):
        for entry in cond or []:
            tensor = entry[0] if isinstance(entry, (list, tuple)) and entry else None
            if isinstance(tensor, torch.Tensor) and tensor.ndim >= 1 and tensor.shape[0] > 1:
                raise ValueError(
                    f"{sampler_name} is sampled item by item under batch_invariant (its step control couples "
                    f"the items), but the {name} conditioning has {tensor.shape[0]} rows, which ComfyUI spreads "
                    f"over the batch of {batch}: use one-row conditioning, another sampler, or batch_invariant off "
                    "on Determinism Setup."
                )


class SteadfastSeededSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastSeededSampler",
            display_name="Seeded Sampler (Steadfast)",
            category="Steadfast",
            description="KSampler whose noise never depends on the device: initial noise and the per-step noise of "
            "ancestral samplers are drawn on the CPU from per-item seeded generators. Also returns a run "
            "record with everything that decides the output bits.",
            inputs=[
                io.Model.Input("model", tooltip="The model used for denoising the input latent."),
                io.Int.Input(
                    "seed",
                    default=0,
                    min=0,
                    max=0xFFFFFFFFFFFFFFFF,
                    control_after_generate=True,
                    tooltip="The random seed used for creating the noise.",
                ),
                io.Int.Input("steps", default=20, min=1, max=10000, tooltip="The number of denoising steps."),
                io.Float.Input(
                    "cfg",
                    default=8.0,
                    min=0.0,
                    max=100.0,
                    step=0.1,
                    round=0.01,
                    tooltip="Classifier-free guidance scale.",
                ),
                io.Combo.Input(
                    "sampler_name", options=comfy.samplers.KSampler.SAMPLERS, tooltip="The sampling algorithm."
                ),
                io.Combo.Input(
                    "scheduler",
                    options=comfy.samplers.KSampler.SCHEDULERS,
                    tooltip="How the noise levels are spaced over the steps.",
                ),
                io.Conditioning.Input("positive", tooltip="What to include in the image."),
                io.Conditioning.Input("negative", tooltip="What to exclude from the image."),
                io.Latent.Input("latent_image", tooltip="The latent to denoise (its size sets the image size)."),
                io.Float.Input(
                    "denoise",
                    default=1.0,
                    min=0.0,
                    max=1.0,
                    step=0.01,
                    tooltip="How much of the latent is replaced by noise (1.0 = all).",
                ),
                io.Combo.Input(
                    "batch_seed_mode",
                    options=BATCH_SEED_MODES,
                    default="incremental",
                    tooltip="incremental: item i of a batch gets the noise of a single run at seed + i "
                    "(initial and per-step noise). That alone makes the NOISE equal, not the "
                    "result: the model may compute a batch differently from a single item. For "
                    "item i's latent to equal the single run, add Determinism Setup with "
                    "batch_invariant on (then for every sampler: one whose step control spans the "
                    "batch, dpm_adaptive, is sampled item by item); for the image too, decode "
                    "with VAE Decode (Steadfast). "
                    "comfy: KSampler's own noise streams, bit-identical to KSampler on x86-64 "
                    "CPUs with AVX2/AVX512 whatever device samples (on a GPU the per-step noise "
                    "is ComfyUI's own GPU noise sampler: equal to KSampler there, not portable to "
                    "the CPU). On ARM or without AVX2, stock KSampler's own initial noise is not "
                    "portable and the pack draws the x86 noise, so the two differ there.",
                ),
            ],
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],  # to name the model file in the run record
            not_idempotent=True,  # two identical sampler nodes in one workflow must both run (determinism check)
            outputs=[
                io.Latent.Output(display_name="LATENT", tooltip="The denoised latent."),
                io.String.Output(
                    display_name="run_record",
                    tooltip="JSON run record: seeds, sampler settings, environment fingerprint, latent hash.",
                ),
            ],
        )

    @classmethod
    def execute(
        cls,
        model,
        seed: int,
        steps: int,
        cfg: float,
        sampler_name: str,
        scheduler: str,
        positive,
        negative,
        latent_image: dict,
        denoise: float = 1.0,
        batch_seed_mode: str = "incremental",
    ) -> io.NodeOutput:
        portable.check_device(model.load_device, "the model")  # portable records only for CPU-computed bits
        latent = comfy.sample.fix_empty_latent_channels(model, latent_image["samples"])
        batch_index = latent_image.get("batch_index")
        opts = steadfast_options(model)
        sampler = comfy.samplers.sampler_object(sampler_name)
        split = _item_by_item(opts, sampler, sampler_name, batch_seed_mode, latent.shape[0], positive, negative)
        host_noise.check_run_seed(
            sampler,
            seed,
            latent.shape[0],
            batch_seed_mode,
            model.load_device,
            batch_index=batch_index,
            item_by_item=split is not None,
        )
        x0, comfy_identical = _initial_noise(latent, seed, batch_seed_mode, batch_index)
        ks = comfy.samplers.KSampler(
            model,
            steps=steps,
            device=model.load_device,
            sampler=sampler_name,
            scheduler=scheduler,
            denoise=denoise,
            model_options=model.model_options,
        )
        run = _Run(model, ks, cfg, positive, negative, sampler_name, steps)
        portable.pin_thread()  # inductor's config is per thread in torch 2.14 (core/determinism/portable.py)
        # base weights + patches, before sampling: never inside the step loop (the base is hashed once per model)
        model_id = identity.model_identity_of(model)
        qkv_before, sdpa_before = qkv_counters(model), sdpa.fallback_counts()
        t0 = time.perf_counter()
        samples, per_step = run.all_items(sampler, x0, latent, latent_image, seed, batch_seed_mode, batch_index, split)
        seconds = time.perf_counter() - t0
        out = {**latent_image, "samples": samples}
        details = _details(
            per_step,
            split,
            sampler_name,
            comfy_identical,
            _qkv_state(model, qkv_before),
            sdpa.fallbacks_since(sdpa_before),
            opts,
        )
        compiled = compile_state(model)
        record = run_record.for_model(
            seed=seed,
            batch=latent.shape[0],
            batch_seed_mode=batch_seed_mode,
            steps=steps,
            cfg=cfg,
            denoise=denoise,
            sampler=sampler_name,
            scheduler=scheduler,
            samples=samples,
            settings=_settings(model, opts, compiled),
            host={**identity.versions(), **identity.comfy_environment()},
            during=run.during,
            compile=compiled,
            model_identity=model_id,
            model_file=identity.model_file(
                cls.hidden.prompt if cls.hidden else None, cls.hidden.unique_id if cls.hidden else None
            ),
            seconds=seconds,
            details=details,
        )
        return with_run_record(out, record)


def _item_by_item(
    opts: SteadfastOptions, sampler, sampler_name: str, batch_seed_mode: str, batch: int, positive, negative
) -> str | None:
    """Why each item is sampled alone (batch invariance on, and a sampler whose step control couples the items),
    or None. Raises ``ValueError`` (:func:`_check_item_conds`) for conditioning that cannot be split per item."""
    if batch_seed_mode != "incremental" or not isinstance(opts.batch_invariant, dict) or batch <= 1:
        return None
    split = host_noise.couples_items(sampler)
    if split is not None:
        _check_item_conds(positive, negative, batch, sampler_name)
    return split


def _initial_noise(
    latent: torch.Tensor, seed: int, batch_seed_mode: str, batch_index
) -> tuple[torch.Tensor, bool | None]:
    """The initial noise (:func:`core.determinism.noise.seeded_noise`), and for ``comfy`` mode whether the pack's
    draw is bit-identical to the running ComfyUI's (checked once per dtype; None in ``incremental`` mode)."""
    draw, comfy_identical = None, None
    if batch_seed_mode == "comfy":  # the pack's own draw against the running ComfyUI's, once per dtype
        draw, comfy_identical = host_noise.comfy_draw(latent.dtype, noise.draw)
    x0 = noise.seeded_noise(
        tuple(latent.shape), seed, mode=batch_seed_mode, dtype=latent.dtype, batch_index=batch_index, draw_dtype=draw
    )
    return x0, comfy_identical


class _Run:
    """One sampling run of the Seeded Sampler: the ``sample_custom`` calls with the pack's per-step noise, and what
    was in effect during sampling (``during``: threads, torch flags, CPU settings, read at the first step)."""

    def __init__(self, model, ks, cfg: float, positive, negative, sampler_name: str, steps: int) -> None:
        self.model, self.ks, self.cfg, self.positive, self.negative = model, ks, cfg, positive, negative
        self.sampler_name = sampler_name
        self.preview = latent_preview.prepare_callback(model, steps)
        self.during: dict = {}

    def callback(self, step, x0_pred, x, total_steps):
        # Runs inside sampling, i.e. inside Determinism Setup's policy: record what was in effect.
        if not self.during:
            self.during["num_threads"] = torch.get_num_threads()
            self.during["flags"] = torch_state.snapshot_state(load_inductor=True).as_dict()
            self.during["cpu_settings"] = portable.cpu_settings()
        return self.preview(step, x0_pred, x, total_steps)

    def all_items(
        self, sampler, x0, latent, latent_image: dict, seed: int, mode: str, batch_index, split: str | None
    ) -> tuple[torch.Tensor, str]:
        """The whole batch in one call, or with ``split`` each item alone at its own seed (same x0 rows:
        incremental noise). CPU Brownian trees (torchsde) draw with torch.randn on CPU generators: routed to
        portable noise only where torch's own bytes differ (core/determinism/randn_route.routed_dtypes)."""
        with randn_route.portable_generator_randn():
            if split is None:
                return self.one(sampler, x0, latent, seed, mode, latent_image.get("noise_mask"))
            masks = _item_masks(latent_image.get("noise_mask"), latent.shape[0])
            parts = []
            for i, item_seed in enumerate(noise.item_seeds(seed, latent.shape[0], "incremental", batch_index)):
                part, per_step = self.one(
                    comfy.samplers.sampler_object(self.sampler_name),
                    x0[i : i + 1],
                    latent[i : i + 1],
                    item_seed,
                    mode,
                    masks[i],
                )
                parts.append(part)
            return torch.cat(parts), f"{per_step}, each item alone at its own seed"

    def one(self, part_sampler, part_x0, part_latent, part_seed, part_mode, mask) -> tuple[torch.Tensor, str]:
        """One ``sample_custom`` call with the pack's per-step noise for ``part_latent`` at ``part_seed``."""
        ns, described = host_noise.per_step_noise(
            part_sampler, part_latent, self.ks.sigmas, part_seed, part_mode, self.model.load_device
        )
        if ns is not None:  # built from ComfyUI's x (the dtype ComfyUI samples in), as ComfyUI's own
            host_noise.bind_to_x(part_sampler, ns)
            part_sampler.extra_options = {**part_sampler.extra_options, "noise_sampler": ns}
        try:
            return comfy.sample.sample_custom(
                self.model,
                part_x0,
                self.cfg,
                part_sampler,
                self.ks.sigmas,
                self.positive,
                self.negative,
                part_latent,
                noise_mask=mask,
                callback=self.callback,
                disable_pbar=not comfy.utils.PROGRESS_BAR_ENABLED,
                seed=part_seed,
            ), described
        except RuntimeError as e:
            if part_latent.dtype in (torch.float16, torch.bfloat16) and "dtype" in str(e):
                raise HalfLatentError(
                    f"{self.sampler_name} cannot sample this {part_latent.dtype} LATENT on this ComfyUI: {e}. This "
                    "ComfyUI samples a half-precision LATENT in its own dtype and the sampler mixes it with "
                    "float32; stock KSampler meets the same error. Use a float32 LATENT (no half-precision "
                    "cast before the sampler) or another sampler."
                ) from e
            raise
        finally:
            if ns is not None:
                ns.close()  # a CPU noise sampler's prefetch thread (a draw for a step that never came is dropped)


def _qkv_state(model, before: dict) -> dict | int:
    """The fused projections' counters of this run (0 when the model has none)."""
    after = qkv_counters(model)
    if not after["modules"]:
        return 0
    return {
        "modules": after["modules"],
        "live_after_run": after["live"],
        "calls_this_run": {k: after[k] - before[k] for k in ("qkv", "kv", "separate")},
        "separate_reasons": after["separate_reasons"],
        "note": "projections inside torch.compile regions are not counted",
    }


def _settings(model, opts: SteadfastOptions, compiled) -> dict:
    """The run record's ``settings``: device, dtype and what the pack's patches set on this clone."""
    return dict(
        device=str(model.load_device),
        dtype=_dtype_of(model),
        attention=_attention_of(opts),
        qkv_fusion=opts.qkv_fusion,
        channels_last=opts.channels_last,
        compile=compiled,
        determinism=opts.last_determinism or opts.determinism or "not set (Determinism Setup not used)",
        **({"quantize": opts.quantize} if opts.quantize is not None else {}),  # absent when off (older records)
        **({"multigpu_cfg_split": devices} if (devices := _multigpu_devices(model)) else {}),  # absent when unused
    )


def _multigpu_devices(model) -> list[str]:
    """The extra devices of ComfyUI's multi-GPU CFG split on ``model`` (its ``"multigpu"`` additional models, added by
    MultiGPU CFG Split), as text; empty when the model has none or the ComfyUI has no multi-GPU support."""
    getter = getattr(model, "get_additional_models_with_key", None)
    clones = getter("multigpu") if getter is not None else []
    return [str(getattr(c, "load_device", "?")) for c in clones or []]


def _details(
    per_step: str,
    split: str | None,
    sampler_name: str,
    comfy_identical: bool | None,
    qkv_state,
    fell_back: dict,
    opts: SteadfastOptions,
) -> dict:
    """The run record's ``details``: per-step noise, CPU randn routing, item-by-item sampling, the initial noise
    against KSampler's (``comfy`` mode), fused projections, SDPA fallbacks, batch invariance."""
    return {
        "per_step_noise": per_step,
        "cpu_randn": randn_route.route_record(),
        **(
            {}
            if split is None
            else {"item_by_item": f"each item sampled alone (batch_invariant): {sampler_name}: {split}"}
        ),
        **(
            {}
            if comfy_identical is None
            else {
                "comfy_initial_noise": (
                    "bit-identical to KSampler's prepare_noise here"
                    if comfy_identical
                    else "NOT bit-identical to KSampler's here: this torch's own CPU randn is not the portable "
                    "(x86 AVX2) one for this dtype; the pack's noise is"
                )
            }
        ),
        "qkv_fusion": qkv_state,
        **({"attention_fallbacks": fell_back} if fell_back else {}),
        "batch_invariant": opts.batch_invariant if opts.batch_invariant is not None else "not set",
    }
