"""Subprocess worker for tests/comfy/test_noise_table.py: what every sampler of ``KSampler.SAMPLERS`` does with
per-step noise in the running ComfyUI, measured by calling it (no source text is read).

Runs in its OWN process (the pytest process never imports ``comfy``). ComfyUI is forced to the CPU; the tiny SD1.5
checkpoint is loaded as a real ModelPatcher with its diffusion model replaced by a stand-in (``0.1 * x``, as
``benchmarks/bench_noise_samplers.py``). Each sampler runs ``comfy.sample.sample_custom`` twice, 4 steps:

* ``own``: no noise sampler handed; ``comfy.k_diffusion.sampling.default_noise_sampler`` and
  ``BrownianTreeNoiseSampler`` are replaced by recording wrappers (the sampler functions look both up as module
  globals when they run): which ComfyUI builds (the tree's ``cpu`` flag too), and how often it is called;
* ``handed``: a recording noise sampler in ``extra_options["noise_sampler"]``: how often it is called.

and once more like ``own`` with another ``seed`` (the same initial noise): whether the output depends on the
per-step noise at all (ComfyUI seeds its own noise sampler with ``extra_args["seed"]``).

Prints ONE ``RESULT <json>`` line, ``{name: {"function", "module", "takes_noise_sampler", "built", "own_calls",
"handed_calls", "built_when_handed", "seed_dependent", "pack_kind"}}`` plus the pack's table (``nodes/host/noise``)::

    COMFYUI_PATH=... python noise_table_worker.py REPO CHECKPOINT   (run by the ``run_child`` fixture)
"""

from __future__ import annotations

import inspect
import json
import sys

import torch


def main() -> int:
    repo, ckpt = sys.argv[1:3]
    sys.path.insert(0, f"{repo}/headless")
    import tiny_sd15

    tiny_sd15.import_comfy()  # $COMFYUI_PATH on sys.path, forced to the CPU
    import comfy.k_diffusion.sampling as kds
    import comfy.sample
    import comfy.samplers
    import comfy.sd

    sys.path.insert(0, f"{repo}/scripts")
    from _steadfast_import import import_steadfast

    import_steadfast()
    from steadfast.nodes.host import noise as host_noise

    class StandIn(torch.nn.Module):
        dtype = torch.float32  # ComfyUI reads diffusion_model.dtype

        def forward(self, x, timesteps=None, context=None, **kwargs):
            return x * 0.1

    base = comfy.sd.load_checkpoint_guess_config(ckpt, output_vae=False, output_clip=False)[0]
    model = base.clone()
    model.add_object_patch("diffusion_model", StandIn())
    cond = [[torch.zeros(1, 77, base.model.model_config.unet_config.get("context_dim", 768)), {}]]
    latent = torch.zeros(1, 4, 8, 8)

    record: dict = {}
    real_default, real_tree = kds.default_noise_sampler, kds.BrownianTreeNoiseSampler

    def counted(ns):
        def call(sigma, sigma_next):
            record["own_calls"] += 1
            return ns(sigma, sigma_next)

        return call

    def default_noise_sampler(x, seed=None):
        record["built"].append("default")
        return counted(real_default(x, seed=seed))

    def brownian_tree(x, sigma_min, sigma_max, seed=None, transform=lambda x: x, cpu=False):
        record["built"].append("brownian" + (" cpu" if cpu else " device"))
        return counted(real_tree(x, sigma_min, sigma_max, seed=seed, transform=transform, cpu=cpu))

    def handed(sigma, sigma_next):
        record["handed_calls"] += 1
        return torch.randn(latent.shape, generator=torch.Generator().manual_seed(record["handed_calls"]))

    out: dict = {}
    for name in comfy.samplers.KSampler.SAMPLERS:
        fn = comfy.samplers.sampler_object(name).sampler_function
        row = {
            "function": getattr(fn, "__name__", repr(fn)),
            "module": getattr(fn, "__module__", None),
            "takes_noise_sampler": "noise_sampler" in inspect.signature(fn).parameters,
        }
        ks = comfy.samplers.KSampler(
            model,
            steps=4,
            device=model.load_device,
            sampler=name,
            scheduler="normal",
            denoise=1.0,
            model_options=model.model_options,
        )
        outputs = {}
        for run in ("own", "handed", "own again"):
            record.update(built=[], own_calls=0, handed_calls=0)
            sampler = comfy.samplers.sampler_object(name)
            if run == "handed":
                sampler.extra_options = {**sampler.extra_options, "noise_sampler": handed}
            kds.default_noise_sampler, kds.BrownianTreeNoiseSampler = default_noise_sampler, brownian_tree
            try:
                x0 = torch.randn(latent.shape, generator=torch.Generator().manual_seed(0))
                outputs[run] = comfy.sample.sample_custom(
                    model,
                    x0,
                    1.0,
                    sampler,
                    ks.sigmas,
                    cond,
                    cond,
                    latent,
                    disable_pbar=True,
                    seed=6 if run == "own again" else 5,
                )
            except Exception as exc:  # noqa: BLE001 - reported, the test fails on it
                row["error"] = f"{name}/{run}: {type(exc).__name__}: {exc}"[:400]
            finally:
                kds.default_noise_sampler, kds.BrownianTreeNoiseSampler = real_default, real_tree
            if run == "own":
                row["built"], row["own_calls"] = sorted(set(record["built"])), record["own_calls"]
            elif run == "handed":
                row["handed_calls"], row["built_when_handed"] = record["handed_calls"], sorted(set(record["built"]))
        if "own" in outputs and "own again" in outputs:
            row["seed_dependent"] = not torch.equal(outputs["own"], outputs["own again"])
        row["pack_kind"] = host_noise.noise_kind(comfy.samplers.sampler_object(name))
        row["couples_items"] = host_noise.couples_items(comfy.samplers.sampler_object(name))
        out[name] = row
    print(
        "RESULT "
        + json.dumps({"samplers": out, "table": host_noise.PER_STEP_NOISE, "coupled": host_noise.COUPLED_ITEMS})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
