"""core/compile/recompiles.py and the registry features built on it: global-flag fingerprints as
recompile reasons, per-run recompile counts, parameter identity, the warning before the limit.

Compiles use ``backend="eager"``: Dynamo's guards (and so its recompiles) do not depend on the backend.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from steadfast.core.compile.options import CompileOptions
from steadfast.core.compile.recompiles import ParamIdentity, code_of, explain_recompile, guarded_flags, parse_recompile
from steadfast.core.compile.registry import CompileRegistry, RecompileError
from steadfast.core.determinism import torch_state
from steadfast.core.torch_compat import cache_entry_count

STATIC = CompileOptions(backend="eager", dynamic=False)


class Block(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


class Net(nn.Module):
    def __init__(self, n: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


@pytest.fixture(autouse=True)
def _fresh():
    state = torch_state.snapshot_state()
    torch._dynamo.reset()
    counters.clear()
    yield
    torch_state.restore_state(state)
    torch._dynamo.reset()
    counters.clear()


def compiled(reg: CompileRegistry, strict: bool = False):
    torch.manual_seed(0)
    m = Net()
    rec, _ = reg.get_or_create(m, STATIC, ["blocks.0", "blocks.1"], strict=strict)
    return m, rec


def call(reg, m, rec, x):
    """One run of one tracked call, without autograd (as ComfyUI samples)."""
    from steadfast.core.compile.swap import swap_in

    with torch.no_grad(), reg.run(rec), reg.track(rec, shape=x), swap_in(m, rec.compiled):
        return m(x)


def global_state_event(*names: str) -> dict:
    return parse_recompile(
        "Recompiling function forward in x.py:1\n    triggered by the following guard failure(s):\n"
        f"    - 0/0: GLOBAL_STATE changed: {' '.join(names)} "
    )


def test_fingerprint_and_diff():
    before = guarded_flags()
    assert {
        "deterministic_algorithms",
        "float32_matmul_precision",
        "num_threads",
        "grad_mode",
        "default_dtype",
        "allow_fp16_accumulation",
    } <= set(before)
    torch.use_deterministic_algorithms(True)
    now = guarded_flags()
    event = explain_recompile(global_state_event("deterministic_algorithms"), [before])
    assert event["reason"] == "global flag changed since compile: deterministic_algorithms False -> True"
    assert event["flag_changes"] == ["deterministic_algorithms False -> True"] and event["cause"] == "global_flag"
    assert "GLOBAL_STATE changed: deterministic_algorithms" in event["guard"]
    # the closest known fingerprint explains it (none differs: the names alone); no fingerprint: the names alone
    assert explain_recompile(global_state_event("deterministic_algorithms"), [now, before])["flag_changes"] == []
    unknown = explain_recompile(global_state_event("allow_tf32", "num_threads"), [])
    assert unknown["reason"] == "global flag changed since compile: allow_tf32, num_threads"
    # Dynamo's allow_tf32 maps to float32_matmul_precision; the derived cuda_matmul_allow_tf32 is left out
    torch.set_float32_matmul_precision("high")
    tf32 = explain_recompile(global_state_event("allow_tf32", "num_threads"), [now])
    assert tf32["flag_changes"] == ["float32_matmul_precision highest -> high"]
    assert explain_recompile(parse_recompile("Recompiling function f\n - 0/1: size mismatch"), [now]).keys() == {
        "function",
        "reason",
        "reasons",
    }


def test_flag_change_is_the_recompile_reason(reg):
    m, rec = compiled(reg)
    x = torch.randn(2, 8)
    with torch.no_grad():
        eager = m(x)
    assert torch.equal(call(reg, m, rec, x), eager)  # eager backend: same ATen ops, same bits
    assert rec.stats.compile_flags["deterministic_algorithms"] is False and rec.stats.recompiles == []
    torch.use_deterministic_algorithms(True)
    call(reg, m, rec, x)
    (event,) = rec.stats.recompiles
    assert event["reason"] == "global flag changed since compile: deterministic_algorithms False -> True"
    assert event["cause"] == "global_flag" and "GLOBAL_STATE changed: deterministic_algorithms" in event["guard"]
    assert rec.stats.last_run["recompiles"] == 1 and rec.stats.last_run["reasons"] == [event["reason"]]
    torch.use_deterministic_algorithms(False)
    call(reg, m, rec, x)  # the graph compiled under the old flags is still cached
    assert (
        len(rec.stats.recompiles) == 1 and rec.stats.last_run["recompiles"] == 0 and rec.stats.last_run["graphs"] == 0
    )
    torch.set_float32_matmul_precision("high")  # Dynamo sees it as "allow_tf32"
    call(reg, m, rec, x)
    assert rec.stats.recompiles[-1]["reason"] == (
        "global flag changed since compile: float32_matmul_precision highest -> high"
    )
    assert "recompile(s)" in rec.as_text() and f"run {rec.stats.runs}: 1 recompile(s)" in rec.as_text()


def test_strict_names_the_flag(reg):
    m, rec = compiled(reg, strict=True)
    x = torch.randn(2, 8)
    call(reg, m, rec, x)
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads != 1 else 2)
    with pytest.raises(RecompileError, match=f"num_threads {threads} -> "):
        call(reg, m, rec, x)


def test_param_identity_in_place_vs_replaced(reg):
    m, rec = compiled(reg)
    x = torch.randn(2, 8)
    call(reg, m, rec, x)
    ident = ParamIdentity.capture({"b": m.blocks[0]})
    with torch.no_grad():
        m.blocks[0].lin.weight.copy_(m.blocks[0].lin.weight * 2)  # in place: same object (no recompile)
    assert ident.replaced({"b": m.blocks[0]}) == []
    call(reg, m, rec, x)
    assert rec.stats.last_run["params_replaced"] == 0 and rec.stats.last_run["recompiles"] == 0
    m.blocks[1].lin.weight = nn.Parameter(m.blocks[1].lin.weight.detach().clone())  # what set_attr_param does
    call(reg, m, rec, x)
    assert rec.stats.last_run["params_replaced"] == 1 and rec.stats.params_replaced == 1
    assert any("replaced by new tensor objects" in w for w in rec.stats.warnings)


def test_warning_before_the_limit_counts_process_wide_entries(reg, caplog):
    m, rec = compiled(reg)
    code = code_of(rec.compiled["blocks.0"])
    assert code is Block.forward.__code__
    with torch._dynamo.config.patch(recompile_limit=5), caplog.at_level(logging.WARNING, "steadfast.registry"):
        call(reg, m, rec, torch.randn(2, 8))
        assert cache_entry_count(code) == 1 and rec.stats.warnings == []
        # another model's record compiling the same forward adds entries to the same code object
        other, rec2 = compiled(reg)
        call(reg, other, rec2, torch.randn(3, 8))
        call(reg, other, rec2, torch.randn(4, 8))
        assert cache_entry_count(code) == 3 and rec.stats.warnings == []
        assert rec2.stats.warnings and "Block.forward has 3 compiled variant(s)" in rec2.stats.warnings[0]
        assert "recompile_limit=5" in rec2.stats.warnings[0] and "2 more" in rec2.stats.warnings[0]
        assert rec.cache_entries() == {"Block.forward": 3}
    assert any("Block.forward has 3" in r.getMessage() for r in caplog.records)
    assert "WARNING: " in rec2.as_text()
