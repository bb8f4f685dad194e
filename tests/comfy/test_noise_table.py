"""``nodes/host/noise.PER_STEP_NOISE`` held to the running ComfyUI: how each sampler draws its per-step noise.

The Seeded Sampler hands a sampler its own per-step noise by an explicit table keyed by the k-diffusion sampler
function's name (before issue 27 it searched the function's source text). These tests fail when ComfyUI changes
a fact the table states. Nothing is read from source: ``tests/comfy/noise_table_worker.py`` runs every sampler of
``KSampler.SAMPLERS`` in a ComfyUI subprocess (tiny checkpoint, stand-in denoiser, 4 steps) with recording noise
samplers, and reports which noise sampler ComfyUI builds when handed none, how often it is called, how often a
handed one is called, and whether the output depends on the per-step noise seed.
"""

from __future__ import annotations

import pytest

#: ``"default"`` rows whose default ``eta`` is 0: ComfyUI builds (0.8.0: also calls) a noise sampler and scales its
#: noise by zero, so the output does not depend on it (a handed one is harmless there).
ETA_ZERO = {"sample_res_multistep", "sample_res_multistep_cfg_pp"}


@pytest.fixture(scope="module")
def measured(run_child):
    return run_child("noise_table_worker.py")


@pytest.mark.comfyui
def test_every_sampler_is_a_row_and_every_row_a_sampler(measured):
    """Each ``KSampler.SAMPLERS`` name's function is in the table (``"none"`` rows are those left out on purpose),
    and the table names no function the running ComfyUI's samplers do not use (0.8.0 and 0.33.0 have the same)."""
    samplers, table = measured["samplers"], measured["table"]
    assert len(samplers) > 20, sorted(samplers)
    used = {row["function"] for row in samplers.values()}
    assert {name: row["function"] for name, row in samplers.items() if row["function"] not in table} == {}
    assert set(table) - used == set()


@pytest.mark.comfyui
def test_table_rows_match_what_comfyuis_samplers_do(measured):
    """``default``: ComfyUI builds ``default_noise_sampler`` and takes a handed one instead (called as often);
    ``brownian``: the same with a ``BrownianTreeNoiseSampler``; ``none``: the output does not depend on per-step
    noise (ComfyUI may draw some and scale it by zero: dpm_fast, dpm_adaptive, euler_cfg_pp, exp_heun_2_x0)."""
    samplers, table = measured["samplers"], measured["table"]
    wrong = {}
    for name, row in samplers.items():
        kind = table[row["function"]]
        if kind in ("default", "brownian"):
            built = ["default"] if kind == "default" else [["brownian cpu"], ["brownian device"]]
            ok = (
                (row["built"] == built if kind == "default" else row["built"] in built)
                and row["takes_noise_sampler"]
                and "error" not in row
                and row["built_when_handed"] == []
                and row["handed_calls"] == row["own_calls"]
                and (row["seed_dependent"] if row["function"] not in ETA_ZERO else not row["seed_dependent"])
            )
        else:
            ok = row.get("seed_dependent") is False
        if not ok:
            wrong[name] = (kind, row)
    assert not wrong, wrong
    # the families are really there: ancestral (default), SDE (brownian, CPU and _gpu), none
    assert {table[samplers[n]["function"]] for n in ("euler_ancestral", "dpmpp_sde", "dpmpp_sde_gpu", "euler")} == {
        "default",
        "brownian",
        "none",
    }


@pytest.mark.comfyui
def test_pack_treats_each_sampler_as_its_row(measured):
    """The Seeded Sampler's treatment (``noise_kind``) is the row, for every sampler (no exception: before issue 37
    ``dpmpp_2m_sde_heun`` was handed the pack's per-item CPU noise instead of ComfyUI's Brownian tree); it never
    hands a noise sampler to a function that does not take one."""
    samplers, table = measured["samplers"], measured["table"]
    wrong = {
        name: (row["pack_kind"], table[row["function"]])
        for name, row in samplers.items()
        if row["pack_kind"] != table[row["function"]]
    }
    assert not wrong, wrong
    assert samplers["dpmpp_2m_sde_heun"]["pack_kind"] == "brownian"
    assert all(row["takes_noise_sampler"] for row in samplers.values() if row["pack_kind"] != "none")


@pytest.mark.comfyui
def test_only_the_coupled_samplers_are_said_to_couple_items(measured):
    """``couples_items`` names exactly the ``COUPLED_ITEMS`` rows among ComfyUI's samplers (dpm_adaptive), each
    with its reason; every other ComfyUI sampler is known (``None``). ``tests/comfy/test_sampler_matrix.py`` shows
    on the real server that the others keep their items apart."""
    samplers, coupled = measured["samplers"], measured["coupled"]
    said = {name: row["couples_items"] for name, row in samplers.items() if row["couples_items"] is not None}
    assert said == {name: coupled[row["function"]] for name, row in samplers.items() if row["function"] in coupled}
    assert "dpm_adaptive" in said and "whole batch" in said["dpm_adaptive"]
