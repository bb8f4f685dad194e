"""core/record/model_identity.py: the digest depends on every weight, dtype and name; cached per (module, token)."""

from __future__ import annotations

import torch

from steadfast.core.record import model_identity as mi


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 4))


def test_digest_depends_on_weights_dtype_and_patches() -> None:
    mi.clear()
    a, b = _net(0), _net(0)
    da, db = mi.module_digest(a), mi.module_digest(b)
    assert da["digest"] == db["digest"] and da["tensors"] == 6 and da["bytes"] == (64 + 8 + 8 + 8 + 32 + 4) * 4
    assert mi.module_digest(_net(1))["digest"] != da["digest"]
    with torch.no_grad():
        b[0].weight[0, 0] += 1e-6  # a LoRA-sized change in one value
    assert mi.module_digest(b, token="patched")["digest"] != da["digest"]
    assert mi.module_digest(_net(0).to(torch.bfloat16))["digest"] != da["digest"]


def test_cached_per_module_and_token() -> None:
    mi.clear()
    net = _net(0)
    first = mi.module_digest(net, token=("uuid", 1))
    with torch.no_grad():
        net[0].weight.zero_()
    again = mi.module_digest(net, token=("uuid", 1))
    assert not first["cached"] and again["cached"] and again["digest"] == first["digest"]
    fresh = mi.module_digest(net, token=("uuid", 2))
    assert not fresh["cached"] and fresh["digest"] != first["digest"]


def _lora(strength: float, seed: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    up, down = torch.randn(8, 2, generator=g), torch.randn(2, 8, generator=g)
    return {"diffusion_model.0.weight": [(strength, ("lora", (up, down, None, None, None, None)), 1.0, None, None)]}


def test_patches_digest_follows_strength_and_tensors():
    """Issue 24 item 4: a LoRA or strength change is named by the patches' digest (no model re-hash)."""
    a = mi.patches_digest(_lora(1.0))
    assert a == mi.patches_digest(_lora(1.0)) and a["keys"] == 1
    assert mi.patches_digest(_lora(0.5))["digest"] != a["digest"]
    assert mi.patches_digest(_lora(1.0, seed=4))["digest"] != a["digest"]
    assert mi.patches_digest({})["digest"] not in (a["digest"], None)


def test_base_digest_reads_the_originals_not_the_patched_parameters():
    """Under legacy ComfyUI loading a LoRA is written into the Parameter (the original kept in a backup); under
    Dynamic VRAM it never is. Hashing the originals (``named``) gives the same base digest either way."""
    clean, patched = _net(0), _net(0)
    original = patched[0].weight.detach().clone()
    with torch.no_grad():
        patched[0].weight.add_(1.0)  # as a LoRA applied in place
    mi.clear()
    want = mi.module_digest(clean, token="base weights")

    def originals():
        for name, t in patched.named_parameters():
            yield name, (original if name == "0.weight" else t)

    got = mi.module_digest(patched, token="base weights", named=originals)
    assert got["digest"] == want["digest"] and got["cached"] is False
    assert mi.module_digest(patched, token="base weights")["cached"] is True  # hashed once per module
    assert mi.module_digest(patched, token="live")["digest"] != want["digest"]  # the patched values differ
    both = mi.combined_digest(want, mi.patches_digest(_lora(1.0)))
    assert both["base_digest"] == want["digest"] and both["patched_keys"] == 1
    assert both["digest"] != mi.combined_digest(want, mi.patches_digest(_lora(0.5)))["digest"]
    assert both["digest"] != mi.combined_digest(mi.module_digest(_net(1)), mi.patches_digest(_lora(1.0)))["digest"]
