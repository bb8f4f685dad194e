"""Issue 23 item 1: the Seeded Sampler's per-step noise lands on the device ComfyUI samples on.

ComfyUI keeps a LATENT on the CPU and samples on the model's device: ``outer_sample`` moves ``x`` and ``sigmas``
there and the samplers add ``noise_sampler(sigmas[i], sigmas[i + 1])`` to ``x``. Before issue 23 the node's
noise sampler returned CPU noise (built from the CPU latent), which crashes every ancestral/SDE sampler on a GPU.
This drives ``SteadfastSeededSampler.execute`` with a real ModelPatcher (tiny checkpoint) in a ComfyUI
subprocess, for every name in ``KSampler.SAMPLERS`` and both seed modes, with the sampling device being ``meta``
(``tests/comfy/noise_device_worker.py``).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def device_runs(run_child):
    return run_child("noise_device_worker.py")


@pytest.mark.comfyui
def test_seeded_sampler_per_step_noise_follows_x_to_a_second_device(device_runs):
    kinds, results = device_runs["kinds"], device_runs["results"]
    assert len(results) == 2 * len(kinds) and len(kinds) > 20, sorted(kinds)
    errors = {k: v["error"] for k, v in results.items() if "error" in v}
    assert not errors, errors
    wrong = {}
    for key, res in results.items():
        if not res["installed"]:
            continue  # ComfyUI's own noise sampler: built by ComfyUI from x itself
        kind = kinds[key.split("/")[0]]
        runs = [res["readable"]] + ([res["meta"]] if kind != "brownian" else [])
        if kind == "brownian" and "error" not in res["meta"]:
            runs.append(res["meta"])
        for run in runs:
            if "error" in run or run["devices"] != ["meta", "meta"] or run["shapes"] != [res["x_shape"]] * 2:
                wrong[key] = run
    assert not wrong, wrong
    # the families of the issue are really driven, not skipped: default (ancestral, CFG++) and Brownian (SDE,
    # _gpu) per-step noise in incremental mode, the default family in comfy mode on this (CPU-loaded) model
    driven = {k for k, v in results.items() if v["installed"]}
    for name in (
        "euler_ancestral/incremental",
        "euler_ancestral/comfy",
        "euler_ancestral_cfg_pp/incremental",
        "euler_ancestral_cfg_pp/comfy",
        "dpmpp_2s_ancestral/comfy",
        "dpmpp_sde/incremental",
        "dpmpp_sde_gpu/incremental",
        "dpmpp_2m_sde_gpu/incremental",
        "dpmpp_3m_sde/incremental",
    ):
        if name.split("/")[0] in kinds:
            assert name in driven, name
    assert {kinds[k.split("/")[0]] for k in driven} == {"default", "brownian"}


@pytest.mark.comfyui
def test_comfy_mode_on_a_gpu_keeps_comfyuis_own_noise_sampler(device_runs):
    """Stock KSampler draws per-step noise from a generator on the GPU seeded ``seed`` (``default_noise_sampler``;
    ``seed + 1`` only on the CPU): only ComfyUI's own sampler gives those bytes, so ``comfy`` mode leaves it."""
    kinds, on_gpu = device_runs["kinds"], device_runs["on_gpu"]
    for name, kind in kinds.items():
        comfy_mode, incremental = on_gpu[f"{name}/comfy"], on_gpu[f"{name}/incremental"]
        assert not comfy_mode["installed"], (name, comfy_mode)
        assert incremental["installed"] == (kind in ("default", "brownian")), (name, incremental)
    assert on_gpu["euler_ancestral/comfy"]["text"] == "comfy default_noise_sampler on cuda (seed 7)"


@pytest.mark.comfyui
def test_comfy_draw_probe_says_bit_identical_exactly_when_the_packs_draw_is(device_runs):
    """The ``comfy`` draw-dtype probe compares ComfyUI's ``prepare_noise`` with the draw the pack makes (before
    issue 23: with ``torch.randn``, then drew ``portable_randn``; on torch 2.11 those differ for fp16/bf16). Also
    with ComfyUI 0.8.0's way (draw in the latent's dtype) patched into the running ComfyUI: on torch 2.11 the pack
    cannot give those half-precision bytes and must say so."""
    probes = device_runs["probes"]
    assert len(probes) == 6
    wrong = {k: v for k, v in probes.items() if v["identical"] != v["equal"]}
    assert not wrong, wrong
    assert probes["running/torch.float32"] == {"identical": True, "equal": True}
