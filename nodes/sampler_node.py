"""Steadfast Seeded Sampler: KSampler with device-independent seeded noise and a run record."""
from __future__ import annotations

import json

import torch
from comfy_api.latest import io

import comfy.model_management
import comfy.sample
import comfy.samplers
import comfy.utils
import latent_preview

from ..core import determinism, fingerprint, hashing, noise
from . import pipeline_paths
from .model_patches import compile_state, qkv_counters, steadfast_options
from .pipeline_nodes import DiffusersPipeline

BATCH_SEED_MODES = ["incremental", "comfy"]


def _accepts_cpu_noise_sampler(sampler) -> bool:
    """True when the k-diffusion sampler draws per-step noise from ``default_noise_sampler``.

    Those samplers build the noise generator on the *sampling device*, so their output depends on the
    device; we hand them a CPU noise sampler instead. BrownianTree SDE samplers (``dpmpp_sde``,
    ``dpmpp_2m_sde``, ...) already draw on the CPU and are left alone, as are samplers without noise.
    """
    import inspect
    fn = getattr(sampler, "sampler_function", None)
    if fn is None or "noise_sampler" not in inspect.signature(fn).parameters:
        return False
    src_name = getattr(fn, "__name__", "")
    return "sde" not in src_name or "er_sde" in src_name


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
                io.MultiType.Input("model", types=[io.Model, DiffusersPipeline],
                                   tooltip="The MODEL used for denoising the input latent, or a DIFFUSERS_PIPELINE "
                                           "(then prompt, negative_prompt, width, height and batch_size are used "
                                           "and the result is the IMAGE output)."),
                io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                             tooltip="The random seed used for creating the noise."),
                io.Int.Input("steps", default=20, min=1, max=10000, tooltip="The number of denoising steps."),
                io.Float.Input("cfg", default=8.0, min=0.0, max=100.0, step=0.1, round=0.01,
                               tooltip="Classifier-free guidance scale."),
                io.Combo.Input("sampler_name", options=comfy.samplers.KSampler.SAMPLERS,
                               tooltip="The sampling algorithm."),
                io.Combo.Input("scheduler", options=comfy.samplers.KSampler.SCHEDULERS,
                               tooltip="How the noise levels are spaced over the steps."),
                io.Conditioning.Input("positive", optional=True,
                                      tooltip="What to include in the image (required for a MODEL)."),
                io.Conditioning.Input("negative", optional=True,
                                      tooltip="What to exclude from the image (required for a MODEL)."),
                io.Latent.Input("latent_image", optional=True, tooltip="The latent to denoise (required for a MODEL)."),
                io.Float.Input("denoise", default=1.0, min=0.0, max=1.0, step=0.01,
                               tooltip="How much of the latent is replaced by noise (1.0 = all)."),
                io.Combo.Input("batch_seed_mode", options=BATCH_SEED_MODES, default="incremental",
                               tooltip="incremental: item i uses seed + i, so item i of a batch equals a single run at "
                                       "seed + i. comfy: ComfyUI's own batch noise stream, bit-identical to KSampler's."),
                io.String.Input("prompt", default="", multiline=True, optional=True,
                                tooltip="DIFFUSERS_PIPELINE only: the text prompt (a MODEL uses 'positive')."),
                io.String.Input("negative_prompt", default="", multiline=True, optional=True,
                                tooltip="DIFFUSERS_PIPELINE only: the negative prompt; empty = the pipeline's default."),
                io.Int.Input("width", default=512, min=16, max=16384, step=8, optional=True,
                             tooltip="DIFFUSERS_PIPELINE only: image width in pixels (a MODEL uses the latent's size)."),
                io.Int.Input("height", default=512, min=16, max=16384, step=8, optional=True,
                             tooltip="DIFFUSERS_PIPELINE only: image height in pixels."),
                io.Int.Input("batch_size", default=1, min=1, max=4096, optional=True,
                             tooltip="DIFFUSERS_PIPELINE only: number of images; image i uses seed + i."),
            ],
            not_idempotent=True,  # two identical sampler nodes in one workflow must both run (determinism check)
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],  # to refuse a wired output this input cannot produce
            outputs=[io.Latent.Output(display_name="LATENT", tooltip="The denoised latent."),
                     io.String.Output(display_name="run_record",
                                      tooltip="JSON: seeds, sampler settings, environment fingerprint, output hash."),
                     io.Image.Output(display_name="IMAGE",
                                     tooltip="DIFFUSERS_PIPELINE only: the decoded images (for a MODEL, decode LATENT).")],
        )

    @classmethod
    def execute(cls, model, seed: int, steps: int, cfg: float, sampler_name: str, scheduler: str,
                positive=None, negative=None, latent_image: dict | None = None, denoise: float = 1.0,
                batch_seed_mode: str = "incremental", prompt: str = "", negative_prompt: str = "",
                width: int = 512, height: int = 512, batch_size: int = 1) -> io.NodeOutput:
        is_pipe = pipeline_paths.is_pipeline(model)
        pipeline_paths.refuse_used_output(cls.hidden.prompt, cls.hidden.unique_id, 0 if is_pipe else 2,
                                          pipeline_paths.LATENT_FOR_PIPELINE if is_pipe else pipeline_paths.IMAGE_FOR_MODEL)
        if is_pipe:
            return pipeline_paths.sample(model, seed=seed, steps=steps, cfg=cfg, sampler_name=sampler_name,
                                         scheduler=scheduler, denoise=denoise, batch_seed_mode=batch_seed_mode,
                                         prompt=prompt, negative_prompt=negative_prompt, width=width,
                                         height=height, batch_size=batch_size)
        missing = [n for n, v in (("positive", positive), ("negative", negative), ("latent_image", latent_image))
                   if v is None]
        if missing:
            raise ValueError(f"Seeded Sampler: sampling a MODEL needs {', '.join(missing)} connected")
        latent = latent_image["samples"]
        latent = comfy.sample.fix_empty_latent_channels(model, latent)
        batch_index = latent_image.get("batch_index")
        x0 = noise.seeded_noise(tuple(latent.shape), seed, mode=batch_seed_mode, dtype=latent.dtype,
                                batch_index=batch_index)

        sampler = comfy.samplers.sampler_object(sampler_name)
        cpu_noise = _accepts_cpu_noise_sampler(sampler)
        if cpu_noise:
            # ComfyUI's CPU default stream is seed + 1; matching it keeps CPU runs equal to KSampler's
            ns = noise.CPUNoiseSampler(latent, seed + 1, per_item=(batch_seed_mode == "incremental"))
            sampler.extra_options = {**sampler.extra_options, "noise_sampler": ns}
        ks = comfy.samplers.KSampler(model, steps=steps, device=model.load_device, sampler=sampler_name,
                                     scheduler=scheduler, denoise=denoise, model_options=model.model_options)
        preview = latent_preview.prepare_callback(model, steps)
        during: dict = {}

        def callback(step, x0_pred, x, total_steps):
            # Runs inside sampling, i.e. inside Determinism Setup's policy: record what was in effect.
            if not during:
                during["num_threads"] = torch.get_num_threads()
                during["flags"] = determinism.snapshot_state(load_inductor=True).as_dict()
            return preview(step, x0_pred, x, total_steps)

        qkv_before = qkv_counters(model)
        samples = comfy.sample.sample_custom(model, x0, cfg, sampler, ks.sigmas, positive, negative, latent,
                                             noise_mask=latent_image.get("noise_mask"), callback=callback,
                                             disable_pbar=not comfy.utils.PROGRESS_BAR_ENABLED, seed=seed)
        out = dict(latent_image)
        out["samples"] = samples

        opts = steadfast_options(model)
        qkv_after = qkv_counters(model)
        qkv_state: dict | int = 0
        if qkv_after["modules"]:
            qkv_state = {"modules": qkv_after["modules"], "live_after_run": qkv_after["live"],
                         "calls_this_run": {k: qkv_after[k] - qkv_before[k] for k in ("qkv", "kv", "separate")},
                         "separate_reasons": qkv_after["separate_reasons"],
                         "note": "projections inside torch.compile regions are not counted"}
        compiled = compile_state(model)
        batch = latent.shape[0]
        record = {
            "seeds": [seed + i for i in range(batch)] if batch_seed_mode == "incremental" else [seed] * batch,
            "batch_seed_mode": batch_seed_mode,
            "sampler": sampler_name, "scheduler": scheduler, "steps": steps, "cfg": cfg, "denoise": denoise,
            "per_step_noise": "cpu" if cpu_noise else "sampler default",
            "latent_shape": list(latent.shape),
            "latent_sha256": hashing.tensor_digest(samples),
            "qkv_fusion": qkv_state,
            "fingerprint": fingerprint.environment_fingerprint(
                device=str(model.load_device),
                dtype=str(model.model.get_dtype()),
                attention=opts.get("attention", "comfy default"),
                qkv_fusion=opts.get("qkv_fusion", 0),
                channels_last=opts.get("channels_last", False),
                compile=compiled,
                determinism=opts.get("last_determinism") or opts.get("determinism") or "not set (Determinism Setup not used)",
            ),
        }
        fp = record["fingerprint"]
        if during:  # the process state after sampling may differ (the policy is restored)
            fp["num_threads"], fp["flags"] = during["num_threads"], during["flags"]
        fp["flags_measured"] = "during sampling" if during else "after sampling (no step callback ran)"
        text = json.dumps(record, indent=1, default=str)
        return io.NodeOutput(out, text, pipeline_paths.blocked_image(), ui={"text": [summary_text(record)],
                                            "steadfast_run_record": [json.loads(text)]})


def summary_text(record: dict) -> str:
    """A few lines for the node's display: hash, seeds, and what decided the bits (fallbacks loudly)."""
    fp = record["fingerprint"]
    lines = [f"latent sha256 {record['latent_sha256'][:16]}…  seeds {record['seeds'][:4]}"
             f"{' …' if len(record['seeds']) > 4 else ''}",
             f"threads {fp['num_threads']}, attention {fp['attention']}"]
    comp = fp.get("compile")
    if isinstance(comp, dict):
        state = f"compile {comp.get('mode')} ({comp.get('backend')}): {comp.get('status')}, " \
                f"{comp.get('graphs')} graph(s), {comp.get('recompiles')} recompile(s)"
        if comp.get("recompiles_this_run") is not None:
            state += f"; this run: {comp['recompiles_this_run']} recompile(s)"
            state += "".join(f"\n  recompiled: {r[:200]}" for r in comp.get("recompile_reasons_this_run") or [])
        for warning in comp.get("warnings") or []:
            state += f"\nWARNING: {warning[:300]}"
        if comp.get("disabled"):
            reasons = comp.get("fallbacks") or ["unknown reason"]
            state += f"\nCOMPILE FAILED -> ran EAGER: {reasons[-1][:300]}"
        lines.append(state)
    return "\n".join(lines)
