"""Subprocess worker for tests/comfy/test_noise_samplers_device.py: the Seeded Sampler's per-step noise, on a
second device, for every sampler in ``KSampler.SAMPLERS`` and both seed modes.

Runs in its OWN process (the pytest process never imports ``comfy``). ComfyUI is forced to the CPU; the tiny
SD1.5 checkpoint is loaded as a real ModelPatcher; ``SteadfastSeededSampler.execute`` runs as ComfyUI runs it,
except that ``comfy.sample.sample_custom`` is replaced by a stand-in that does what ComfyUI's sampling does to
the tensors a noise sampler sees (``outer_sample`` moves ``x`` and ``sigmas`` to the model's device; the
samplers call ``noise_sampler(sigmas[i], sigmas[i + 1])``) with that device being ``meta`` instead of a GPU,
and records what the node's noise sampler returned: once with ``sigma`` on ``meta``, once with a ``sigma`` whose
value is readable but whose ``device`` says ``meta`` (the Brownian tree reads sigma's value, as it can on CUDA).
Prints ONE ``RESULT <json>`` line::

    COMFYUI_PATH=... python noise_device_worker.py REPO CHECKPOINT   (run by the ``run_child`` fixture)
"""

from __future__ import annotations

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
    from steadfast.nodes import sampler_node
    from steadfast.nodes.host import noise as host_noise

    model = comfy.sd.load_checkpoint_guess_config(ckpt, output_vae=False, output_clip=False)[0]
    second = torch.device("meta")  # where a GPU would be: ComfyUI moves x and sigmas to the model's device
    seen: dict = {}

    class Readable(torch.Tensor):
        """A sigma that says it lives on the second device but whose value can be read, as a CUDA one can
        (ComfyUI's ``BatchedBrownianTree`` reads ``t0 < t1`` and copies ``t0`` to the CPU; meta has no values)."""

        __torch_function__ = torch._C._disabled_torch_function_impl  # ops give plain CPU tensors

        @property
        def device(self):
            return second

    def steps(ns, sig):
        got = [ns(sig(i), sig(i + 1)) for i in range(2)]  # two steps: the prefetched draw is handed too
        return {
            "devices": [str(t.as_subclass(torch.Tensor).device) for t in got],
            "shapes": [list(t.shape) for t in got],
        }

    def sample_custom(model, noise, cfg, sampler, sigmas, positive, negative, latent_image, **kwargs):
        x = noise.to(device=second)
        ns = sampler.extra_options.get("noise_sampler")
        if ns is None:
            seen["result"] = {"installed": False}
            return latent_image
        result = {"installed": True, "type": type(ns).__name__, "x_shape": list(x.shape)}
        meta = sigmas.to(second)
        try:
            result["meta"] = steps(ns, lambda i: meta[i])
        except RuntimeError as exc:  # a sampler that must read sigma's value (the Brownian tree)
            result["meta"] = {"error": str(exc)[:200]}
        result["readable"] = steps(ns, lambda i: sigmas[i].as_subclass(Readable))
        seen["result"] = result
        return latent_image

    comfy.sample.sample_custom = sample_custom
    kinds, results, on_gpu = {}, {}, {}
    latent = torch.zeros(2, 4, 8, 8)
    for name in comfy.samplers.KSampler.SAMPLERS:
        kinds[name] = host_noise.noise_kind(comfy.samplers.sampler_object(name))
        for mode in sampler_node.BATCH_SEED_MODES:  # what the node would choose for a model on a GPU
            ns, text = host_noise.per_step_noise(
                comfy.samplers.sampler_object(name),
                latent,
                torch.tensor([14.6, 3.0, 0.0]),
                7,
                mode,
                torch.device("cuda"),
            )
            on_gpu[f"{name}/{mode}"] = {"installed": ns is not None, "text": text}
        for mode in sampler_node.BATCH_SEED_MODES:
            seen.clear()
            try:
                sampler_node.SteadfastSeededSampler.execute(
                    model, 7, 3, 1.0, name, "normal", [], [], {"samples": latent}, 1.0, mode
                )
                results[f"{name}/{mode}"] = seen.get("result", {"error": "sample_custom was not called"})
            except Exception as exc:  # noqa: BLE001 - reported, the test fails on it
                results[f"{name}/{mode}"] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    # comfy mode's draw-dtype probe against the draw the pack makes: is "bit-identical" true exactly when it is?
    from steadfast.core.determinism import noise as sf_noise

    def in_dtype(latent_image, generator, noise_inds=None):  # ComfyUI 0.8.0's prepare_noise_inner (no inds)
        return torch.randn(
            latent_image.size(),
            dtype=latent_image.dtype,
            layout=latent_image.layout,
            generator=generator,
            device="cpu",
        )

    probes = {}
    running = comfy.sample.prepare_noise_inner
    for way, inner in (("running", running), ("draws in the latent dtype", in_dtype)):
        comfy.sample.prepare_noise_inner = inner
        host_noise.comfy_draw.cache_clear()
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            draw, identical = host_noise.comfy_draw(dtype, sf_noise.draw)
            shape = (2, 4, 25, 10)
            ours = sf_noise.seeded_noise(shape, 3, mode="comfy", dtype=dtype, draw_dtype=draw)
            theirs = comfy.sample.prepare_noise(torch.zeros(shape, dtype=dtype), 3)
            probes[f"{way}/{dtype}"] = {
                "identical": identical,
                "equal": torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8)),
            }
    comfy.sample.prepare_noise_inner = running
    print(
        "RESULT "
        + json.dumps(
            {
                "kinds": kinds,
                "results": results,
                "on_gpu": on_gpu,
                "probes": probes,
                "default_noise_sampler_file": kds.__file__,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
