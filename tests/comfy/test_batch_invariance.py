"""Bits that depend only on the workflow: free memory and batch composition must not change a byte.

Over HTTP on a real ComfyUI with the tiny SD1.5 checkpoint. The test-only ``squeeze_pack`` makes ComfyUI
*see* 1 MiB of free memory while sampling / decoding (as on a GPU shared with other processes).

* the hazard is real: stock KSampler's latent and stock VAE Decode's image change under the squeeze;
* Determinism Setup (defaults) + Seeded Sampler + VAE Decode (Steadfast) give the same latent and image
  squeezed or not, before and after ``POST /free``;
* item i of a batch of 2 or 3 equals the batch-1 run at seed + i (LATENT and float IMAGE), with an
  ancestral and an SDE sampler, and with regional compile.
"""

from __future__ import annotations

from typing import Any

import pytest
from comfy_server import ComfyServer
from steadfast_workflows import add, hash_of, record_of, run, text, workflow

pytestmark = pytest.mark.comfyui

STEPS = 3
SQUEEZE_MB = 1


def _base(batch: int = 1) -> dict[str, Any]:
    """determinism_check reduced to checkpoint, prompts, latent and Determinism Setup (node 5)."""
    wf = workflow("determinism_check", steps=STEPS)
    wf["4"]["inputs"]["batch_size"] = batch
    for n in [k for k in wf if k not in ("1", "2", "3", "4", "5")]:
        del wf[n]
    return wf


def _sample(
    wf: dict, model: list, seed: int, latent: list, sampler: str = "euler_ancestral", stock: bool = False
) -> str:
    common = dict(
        model=model,
        seed=seed,
        steps=STEPS,
        cfg=7.0,
        sampler_name=sampler,
        scheduler="normal",
        positive=["2", 0],
        negative=["3", 0],
        latent_image=latent,
        denoise=1.0,
    )
    if stock:
        return add(wf, "KSampler", **common)
    return add(wf, "SteadfastSeededSampler", **common, batch_seed_mode="incremental")


def _hashes(wf: dict, latent_node: str, decoder: str, squeeze_decode: bool = False) -> tuple[str, str]:
    """Add Hash nodes for the LATENT of ``latent_node`` and its decoded IMAGE; returns their ids."""
    if squeeze_decode:
        image = add(
            wf, "TestSqueezedVAEDecode", samples=[latent_node, 0], vae=["1", 2], free_mb=SQUEEZE_MB, decoder=decoder
        )
    else:
        image = add(wf, decoder, samples=[latent_node, 0], vae=["1", 2])
    return add(wf, "SteadfastHash", latent=[latent_node, 0]), add(wf, "SteadfastHash", image=[image, 0])


def _squeezed_and_not(server: ComfyServer, stock: bool) -> tuple[tuple[str, str], tuple[str, str]]:
    wf = _base(batch=2)
    model = ["1", 0] if stock else ["5", 0]
    decoder = "VAEDecode" if stock else "SteadfastVAEDecode"
    quiet = _sample(wf, model, 42, ["4", 0], stock=stock)
    squeezed_model = add(wf, "TestSqueezeFreeMemoryModel", model=model, free_mb=SQUEEZE_MB)
    busy = _sample(wf, [squeezed_model, 0], 42, ["4", 0], stock=stock)
    hq, hb = _hashes(wf, quiet, decoder), _hashes(wf, busy, decoder, squeeze_decode=True)
    entry = run(server, wf)
    return (hash_of(entry, hq[0]), hash_of(entry, hq[1])), (hash_of(entry, hb[0]), hash_of(entry, hb[1]))


def test_free_memory_changes_stock_bytes(comfy_server: ComfyServer) -> None:
    """The hazard: ComfyUI's KSampler and VAE Decode give other bytes when free memory is low."""
    quiet, busy = _squeezed_and_not(comfy_server, stock=True)
    assert quiet[0] != busy[0], "stock KSampler's latent did not change under squeezed free memory"
    assert quiet[1] != busy[1], "stock VAE Decode's image did not change under squeezed free memory"


def test_steadfast_bytes_ignore_free_memory(comfy_server: ComfyServer) -> None:
    """Determinism Setup (defaults) + Seeded Sampler + VAE Decode (Steadfast): same bytes squeezed or not,
    before and after ``POST /free`` (models unloaded, caches dropped)."""
    quiet, busy = _squeezed_and_not(comfy_server, stock=False)
    assert quiet == busy
    comfy_server.post("/free", {"unload_models": True, "free_memory": True})
    again_quiet, again_busy = _squeezed_and_not(comfy_server, stock=False)
    assert again_quiet == quiet and again_busy == quiet


def _batch_vs_singles(
    server: ComfyServer, batch: int, sampler: str, optimize: dict | None = None, patches=None
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], dict, dict]:
    """Hashes of the items of a batch-``batch`` run at seed 42 and of batch-1 runs at 42 + i. ``patches(wf, model)``
    may add nodes between Determinism Setup and Optimize Model and return the new model link."""
    wf = _base(batch=batch)
    model = ["5", 0]
    if patches is not None:
        model = patches(wf, model)
    if optimize is not None:
        model = [add(wf, "SteadfastOptimizeModel", model=model, **optimize), 0]
    single_latent = add(wf, "EmptyLatentImage", width=64, height=64, batch_size=1)
    batched = _sample(wf, model, 42, ["4", 0], sampler)
    image = add(wf, "SteadfastVAEDecode", samples=[batched, 0], vae=["1", 2])
    items, singles = [], []
    for i in range(batch):
        lat = add(wf, "LatentFromBatch", samples=[batched, 0], batch_index=i, length=1)
        img = add(wf, "ImageFromBatch", image=[image, 0], batch_index=i, length=1)
        items.append((add(wf, "SteadfastHash", latent=[lat, 0]), add(wf, "SteadfastHash", image=[img, 0])))
        singles.append(_hashes(wf, _sample(wf, model, 42 + i, [single_latent, 0], sampler), "SteadfastVAEDecode"))
    entry = run(server, wf, timeout=900)
    got = lambda pairs: [(hash_of(entry, a), hash_of(entry, b)) for a, b in pairs]  # noqa: E731
    return got(items), got(singles), record_of(entry, batched), entry


@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("sampler", ["euler_ancestral", "dpmpp_2m_sde"])
def test_batch_item_equals_single_run_at_seed_plus_i(comfy_server: ComfyServer, batch: int, sampler: str) -> None:
    items, singles, record, _ = _batch_vs_singles(comfy_server, batch, sampler)
    assert items == singles
    assert len({h for h, _ in items}) == batch, "items of the batch are equal: the output ignores the seed"
    assert record["details"]["batch_invariant"]["rows"].startswith("each (batch item, conditioning)")
    assert record["seeds"] == [42 + i for i in range(batch)]


@pytest.mark.slow
def test_batch_item_equals_single_run_with_regional_compile(comfy_server: ComfyServer) -> None:
    optimize = dict(
        qkv_fusion=False,
        channels_last=False,
        attention="auto",
        compile="regional",
        backend="inductor",
        mode="default",
        dynamic="auto",
        fullgraph=False,
        strict_recompiles=False,
        compile_cache="",
    )
    items, singles, record, _ = _batch_vs_singles(comfy_server, 2, "euler_ancestral", optimize)
    assert items == singles and items[0] != items[1]
    assert record["compile"]["mode"] == "regional"


def test_switch_off_is_recorded(comfy_server: ComfyServer) -> None:
    """batch_invariant off: ComfyUI's own batching, and the run record and the report say so."""
    wf = _base(batch=1)
    wf["5"]["inputs"]["batch_invariant"] = False
    s = _sample(wf, ["5", 0], 42, ["4", 0])
    add(wf, "SteadfastHash", latent=[s, 0])
    entry = run(comfy_server, wf)
    assert record_of(entry, s)["details"]["batch_invariant"].startswith("off:")
    assert "batch-invariant sampling: off" in text(entry, "5")


def test_combined_conditioning_is_refused_with_a_reason(comfy_server: ComfyServer) -> None:
    """Two conditioning entries are grouped by free memory inside ComfyUI: refused, naming the switch."""
    from comfy_server import PromptFailed

    wf = _base(batch=1)
    both = add(wf, "ConditioningCombine", conditioning_1=["2", 0], conditioning_2=["3", 0])
    s = _sample(wf, ["5", 0], 42, ["4", 0])
    wf[s]["inputs"]["positive"] = [both, 0]
    add(wf, "SteadfastHash", latent=[s, 0])
    with pytest.raises(PromptFailed) as info:
        run(comfy_server, wf)
    assert "BatchInvarianceError" in (info.value.exception_type or "")
    assert "batch_invariant off" in info.value.exception_message


LORA_NAME = "steadfast_batch_invariance_lora.safetensors"


@pytest.mark.slow
def test_batch_invariance_composes_with_lora_block_patches_and_full_compile(
    comfy_server: ComfyServer, tiny_ckpt, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """LoRA (weight patches), FreeU_V2 (a ControlNet-style patch on the UNet's output blocks), QKV fusion,
    channels-last and full compile together: item i still equals seed + i, and the batch-1 runs after the batched
    one recompile nothing (every model call has the same batch-1 shape)."""
    from steadfast_workflows import build_lora

    path = tmp_path_factory.mktemp("bi_lora") / LORA_NAME
    build_lora(tiny_ckpt, path, seed=7)
    comfy_server.link_models("loras", {LORA_NAME: path})

    def patches(wf: dict, model: list) -> list:
        lora = add(wf, "LoraLoaderModelOnly", model=model, lora_name=LORA_NAME, strength_model=1.0)
        return [add(wf, "FreeU_V2", model=[lora, 0], b1=1.3, b2=1.4, s1=0.9, s2=0.2), 0]

    optimize = dict(
        qkv_fusion=True,
        channels_last=True,
        attention="auto",
        compile="full",
        backend="eager",
        mode="default",
        dynamic="auto",
        fullgraph=False,
        strict_recompiles=False,
        compile_cache="",
    )
    items, singles, record, entry = _batch_vs_singles(comfy_server, 2, "euler_ancestral", optimize, patches)
    assert items == singles and items[0] != items[1]
    assert record["compile"]["mode"] == "full"
    samplers = [k for k, v in entry["prompt"][2].items() if v["class_type"] == "SteadfastSeededSampler"]
    assert sum(record_of(entry, k)["recompiles_this_run"] for k in samplers) == 0
