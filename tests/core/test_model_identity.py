"""core/model_identity.py: the digest depends on every weight, dtype and name; cached per (module, token)."""
from __future__ import annotations

import torch

from steadfast.core import model_identity as mi


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
