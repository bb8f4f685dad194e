"""Noise cost of the Seeded Sampler against stock KSampler, through ComfyUI's own sampling (issue 23 item 3).

Runs ComfyUI in-process (``args.cpu``) on the cached tiny SD1.5-architecture checkpoint whose UNet is replaced by
a cheap stand-in (an object patch of ``diffusion_model`` returning ``0.1 * x``), so what is left is the sampler's
own cost: its math and, above all, its noise. Both sides go through ``comfy.sample.sample_custom`` with the same
sigmas (``normal`` schedule), cfg 1.0 and the SDXL latent size 1x4x128x128:

- **stock** (KSampler): initial noise ``comfy.sample.prepare_noise`` (what ``common_ksampler`` calls), the
  sampler's own per-step noise (``default_noise_sampler`` / ``BrownianTreeNoiseSampler(cpu=True)``);
- **seeded** (Seeded Sampler): the node's real noise path: ``core.determinism.noise.seeded_noise`` (with the
  ``comfy`` draw dtype the node asks for), ``nodes.host.noise.per_step_noise`` and ``portable_generator_randn``
  around the call, exactly as ``SteadfastSeededSampler.execute`` does (its run record, written after sampling,
  is not timed).

Printed per sampler and seed mode: median and min seconds of each side over ``--rounds`` INTERLEAVED rounds
(stock, seeded, stock, ...) after one untimed call each, the ratio seeded / stock, and whether the two outputs
are bit-identical (``comfy`` mode must be). The machine may be shared: the load average is printed.

Usage::

    COMFYUI_PATH=~/comfy/ComfyUI-0.33.0 python benchmarks/bench_noise_samplers.py [--rounds 7] [--steps 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds per case")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--side", type=int, default=128, help="latent side (128: SDXL at 1024 px)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--samplers", default="euler_ancestral,dpmpp_sde")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _common.import_pack(cpu=True)
    import torch

    import comfy.sample
    import comfy.samplers
    import comfy.sd

    from steadfast.core.determinism import noise as sf_noise
    from steadfast.core.determinism import randn_route
    from steadfast.nodes.host import noise as comfy_noise

    if args.threads:
        torch.set_num_threads(args.threads)
    ckpt = _common.tiny_sd15_module().cached_tiny_sd15()
    t_start = time.perf_counter()
    _common.print_header(
        "Seeded Sampler noise vs KSampler (ComfyUI sampling, stand-in UNet)",
        {
            "checkpoint": f"{ckpt.name}, diffusion_model replaced by `0.1 * x` (object patch)",
            "sampling": f"{args.steps} steps, normal schedule, cfg 1.0, latent 1x4x{args.side}x{args.side}, "
            f"seed {args.seed}",
            "timing": f"{args.rounds} interleaved rounds per case after one untimed call each",
            "cpu_randn": randn_route.route_record(),
        },
    )

    class StandIn(torch.nn.Module):
        dtype = torch.float32  # ComfyUI reads diffusion_model.dtype

        def forward(self, x, timesteps=None, context=None, **kwargs):
            return x * 0.1

    rows: list[list[Any]] = []
    with torch.inference_mode():
        base = comfy.sd.load_checkpoint_guess_config(str(ckpt), output_vae=False, output_clip=False)[0]
        model = base.clone()
        model.add_object_patch("diffusion_model", StandIn())
        dim = base.model.model_config.unet_config.get("context_dim", 768)
        cond = [[torch.zeros(1, 77, dim), {}]]
        latent = torch.zeros(1, 4, args.side, args.side)

        def run(name: str, mode: str, seeded: bool) -> torch.Tensor:
            sampler = comfy.samplers.sampler_object(name)
            ks = comfy.samplers.KSampler(
                model,
                steps=args.steps,
                device=model.load_device,
                sampler=name,
                scheduler="normal",
                denoise=1.0,
                model_options=model.model_options,
            )
            if not seeded:
                x0 = comfy.sample.prepare_noise(latent, args.seed)
                return comfy.sample.sample_custom(
                    model, x0, 1.0, sampler, ks.sigmas, cond, cond, latent, disable_pbar=True, seed=args.seed
                )
            draw = comfy_noise.comfy_draw(latent.dtype, sf_noise.draw)[0] if mode == "comfy" else None
            x0 = sf_noise.seeded_noise(tuple(latent.shape), args.seed, mode=mode, dtype=latent.dtype, draw_dtype=draw)
            ns, _ = comfy_noise.per_step_noise(sampler, latent, ks.sigmas, args.seed, mode, model.load_device)
            if ns is not None:
                sampler.extra_options = {**sampler.extra_options, "noise_sampler": ns}
            with randn_route.portable_generator_randn():
                out = comfy.sample.sample_custom(
                    model, x0, 1.0, sampler, ks.sigmas, cond, cond, latent, disable_pbar=True, seed=args.seed
                )
            if isinstance(ns, sf_noise.CPUNoiseSampler):
                ns.close()
            return out

        for name in args.samplers.split(","):
            for mode in ("incremental", "comfy"):
                outs = {s: run(name, mode, s) for s in (False, True)}  # untimed, and the bytes
                times: dict[bool, list[float]] = {False: [], True: []}
                for _ in range(args.rounds):
                    for s in (False, True):
                        t0 = time.perf_counter()
                        run(name, mode, s)
                        times[s].append(time.perf_counter() - t0)
                (smin, smed), (omin, omed) = _common.summarize(times[False]), _common.summarize(times[True])
                same = torch.equal(outs[False].view(torch.int32), outs[True].view(torch.int32))
                rows.append(
                    [
                        name,
                        mode,
                        f"{smed:.3f}",
                        f"{smin:.3f}",
                        f"{omed:.3f}",
                        f"{omin:.3f}",
                        f"{omed / smed:.3f}",
                        f"{omin / smin:.3f}",
                        "yes" if same else "no",
                    ]
                )
    print(
        _common.markdown_table(
            [
                "sampler",
                "seed mode",
                "KSampler median s",
                "KSampler min s",
                "Seeded median s",
                "Seeded min s",
                "ratio median",
                "ratio min",
                "bit-identical",
            ],
            rows,
        )
    )
    print()
    _common.print_footer(t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
