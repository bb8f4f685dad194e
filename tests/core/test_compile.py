"""Tests for core/compile/swap.py, core/compile/guards.py and core/compile/blocks.py: options, guard filters, the
block finder, lazy regional compile and swap-in.

Plumbing tests use ``backend="eager"`` (Dynamo tracing only, no C++ compiler). One small inductor
test shows the real thing: identical blocks share one graph and compiled output is run-to-run
identical; its parity with eager is measured and printed, not asserted.
"""

from __future__ import annotations

import time
from collections import namedtuple

import pytest
import torch
from tiny_modules import Block, Tiny, block_paths
from torch import nn
from torch._dynamo.utils import counters

from steadfast.core.compile.blocks import choose_blocks
from steadfast.core.compile.guards import SkipGuardsOn
from steadfast.core.compile.options import CompileOptions
from steadfast.core.compile.swap import compile_blocks, swap_in
from steadfast.core.torch_compat import inductor_mode_options, supports_guard_filter_fn

EAGER = CompileOptions(backend="eager", dynamic=False)


class Other(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Nested(nn.Module):
    """Block-like container that itself holds a ModuleList of repeated Others (must not be listed twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.ModuleList(Other() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.inner:
            x = m(x)
        return x


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Nested(), Nested(), Other()])  # 2 Nested, 1 Other
        self.single = nn.ModuleList([Block()])
        self.head = Nested()  # matches by class name but is not in a ModuleList


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# ---- options ---------------------------------------------------------------------------------
def test_to_kwargs_plain_and_fresh_dicts():
    opts = CompileOptions(backend="eager", dynamic=True, fullgraph=True, options={"a": 1})
    kw = opts.to_kwargs()
    assert kw == {"backend": "eager", "mode": None, "dynamic": True, "fullgraph": True, "options": {"a": 1}}
    kw["options"]["a"] = 2  # torch.compile pops from options: each call must get its own dict
    assert opts.to_kwargs()["options"] == {"a": 1}
    assert CompileOptions().to_kwargs()["options"] is None


def test_mode_merged_into_options_with_guard_filter():
    assert supports_guard_filter_fn()  # torch 2.13/2.14 in this venv
    flt = SkipGuardsOn()
    preset = inductor_mode_options("max-autotune-no-cudagraphs")
    assert preset  # non-empty preset for this mode
    kw = CompileOptions(mode="max-autotune-no-cudagraphs", options={"max_autotune": False}).to_kwargs(flt)
    assert kw["mode"] is None  # torch forbids mode + options, so the preset travels in options
    assert kw["options"]["guard_filter_fn"] is flt
    assert kw["options"]["max_autotune"] is False  # explicit option wins over the preset
    for k in preset.keys() - {"max_autotune"}:
        assert kw["options"][k] == preset[k]
    # mode alone stays a mode; torch accepts the merged form (lazy: nothing is compiled here)
    assert CompileOptions(mode="max-autotune-no-cudagraphs").to_kwargs()["mode"] == "max-autotune-no-cudagraphs"
    torch.compile(nn.Linear(2, 2), **kw)
    with pytest.raises(ValueError, match="mode"):
        CompileOptions(backend="eager", mode="default").to_kwargs(flt)
    with pytest.raises(ValueError, match="Unrecognized mode"):
        inductor_mode_options("no-such-mode")


def test_skip_guards_on_filters_by_name_and_prevents_recompiles():
    Entry = namedtuple("Entry", "name")
    flt = SkipGuardsOn("transformer_options")
    assert flt([Entry("L['x']"), Entry("L['transformer_options']['block']")]) == [True, False]
    assert flt == SkipGuardsOn() and hash(flt) == hash(SkipGuardsOn())  # equal filters -> registry can reuse compiles
    assert flt != SkipGuardsOn("other")

    class UsesOptions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x, transformer_options):
            y = self.lin(x)
            if transformer_options["block"][1] >= 0:  # a value that changes per block, always true
                y = y * 1.0
            return y

    x = torch.randn(2, 8)
    graphs = {}
    for name, f in (("no_filter", None), ("filter", flt)):
        torch._dynamo.reset()
        counters.clear()
        m = UsesOptions()
        c = torch.compile(m, **EAGER.to_kwargs(f))
        for i in range(3):
            out = c(x, {"block": ("double", i)})
            assert torch.equal(out, m(x, {"block": ("double", i)}))
        graphs[name] = counters["stats"]["unique_graphs"]
    assert graphs == {"no_filter": 3, "filter": 1}


# ---- the block finder ------------------------------------------------------------------------
def test_named_classes_outermost_only():
    m = Mixed()
    assert choose_blocks(m, classes=["Nested"]).paths == ["layers.0", "layers.1", "head"]
    assert choose_blocks(m, classes=["Other"]).paths == [
        "layers.0.inner.0",
        "layers.0.inner.1",
        "layers.0.inner.2",
        "layers.1.inner.0",
        "layers.1.inner.1",
        "layers.1.inner.2",
        "layers.2",
        "head.inner.0",
        "head.inner.1",
        "head.inner.2",
    ]
    # Nested and its inner Others both match: only the outermost are kept
    choice = choose_blocks(m, classes=["Nested", "Other"])
    assert choice.how == "named" and choice.paths == ["layers.0", "layers.1", "layers.2", "head"]
    assert choice.classes == {"Nested": 3, "Other": 1}
    none = choose_blocks(m, classes=["Mixed"])  # the root itself is never a block, and there is no fallback
    assert none.paths == [] and none.how == "named" and "Mixed" in none.reason
    assert choose_blocks(m, classes=[]).paths == []


def test_auto_discovery_counts_model_wide_and_drops_small_groups():
    m = Mixed()
    # candidates are children of ModuleLists: 2x Nested and 10x Other model-wide qualify, the lone Block does
    # not; the Others inside a chosen Nested are not searched again; an Other is a pure wrapper (its forward is
    # ``return self.lin(x)``), so its Linear is what gets compiled
    choice = choose_blocks(m)  # Mixed is not in the declared table
    assert choice.how == "auto-discovered" and choice.reason is None
    lins = ["layers.2.lin", "head.inner.0.lin", "head.inner.1.lin", "head.inner.2.lin"]
    assert choice.discovery.groups == {"Nested": ["layers.0", "layers.1"], "Linear": lins}
    assert choice.paths == ["layers.0", "layers.1", *lins] and choice.classes == {"Nested": 2, "Linear": 4}
    assert choose_blocks(m, min_repeats=11).paths == []  # no class repeats 11 times
    assert choose_blocks(Tiny(n=4)).paths == [f"blocks.{i}" for i in range(4)]
    # a group under min_param_share of the parameters is left eager, and reported
    small = choose_blocks(m, min_param_share=0.5)
    assert small.paths == ["layers.0", "layers.1"] and set(small.discovery.dropped) == {"Linear"}
    for bad in ({"min_repeats": 0}, {"min_param_share": 1.5}, {"classes": ["Block"], "discover": True}):
        with pytest.raises(ValueError):
            choose_blocks(m, **bad)


def test_diffusers_style_declaration_by_class_names():
    m = Tiny(n=3)
    m._repeated_blocks = ["Block"]  # diffusers convention: class names
    assert choose_blocks(m, classes=m._repeated_blocks).paths == ["blocks.0", "blocks.1", "blocks.2"]


# ---- compile + swap --------------------------------------------------------------------------
def test_compile_blocks_is_lazy_and_does_not_mutate():
    m = Tiny(n=3)
    before = [id(b) for b in m.blocks]
    compiled = compile_blocks(m, block_paths(m), EAGER)
    assert list(compiled) == ["blocks.0", "blocks.1", "blocks.2"]
    assert [id(b) for b in m.blocks] == before
    assert all(c._orig_mod is m.blocks[i] for i, c in enumerate(compiled.values()))
    assert counters["stats"]["unique_graphs"] == 0  # nothing traced until called
    for bad in ([""], ["blocks.9"], ["blocks.0", "blocks.0"]):
        with pytest.raises(ValueError):
            compile_blocks(m, bad, EAGER)


def test_swap_in_uses_compiled_blocks_and_restores_even_on_error():
    torch.manual_seed(0)
    m = Tiny(n=4)
    originals = list(m.blocks)
    compiled = compile_blocks(m, [f"blocks.{i}" for i in range(4)], EAGER)
    x = torch.randn(2, 5, 8)
    ref = m(x)
    assert not torch.equal(ref, m(torch.randn(2, 5, 8)))  # output depends on the input
    with swap_in(m, compiled) as root:
        assert root is m
        assert all(m.blocks[i] is compiled[f"blocks.{i}"] for i in range(4))
        out = m(x)
    assert all(a is b for a, b in zip(m.blocks, originals))
    assert torch.equal(out, ref)  # eager backend runs the same kernels: measured bit-equal
    # identical blocks share one graph through Dynamo's per-code-object cache
    assert counters["stats"]["unique_graphs"] == 1

    with pytest.raises(RuntimeError, match="boom"):
        with swap_in(m, compiled):
            raise RuntimeError("boom")
    assert all(a is b for a, b in zip(m.blocks, originals))
    assert all(type(b) is Block for b in m.blocks)
    with pytest.raises(ValueError):
        with swap_in(m, {"nope.0": compiled["blocks.0"]}):
            pass
    assert all(a is b for a, b in zip(m.blocks, originals))


def test_full_compile_is_one_block_of_the_parent():
    root = nn.Module()
    root.model = Tiny(n=2)
    x = torch.randn(1, 3, 8)
    compiled = compile_blocks(root, ["model"], EAGER)  # as the Optimize node's compile=full ("diffusion_model")
    with swap_in(root, compiled):
        out = root.model(x)
    assert torch.equal(out, root.model(x)) and root.model is not compiled["model"]
    assert counters["stats"]["unique_graphs"] == 1


def test_inductor_regional_shared_graph_and_run_to_run(capsys):
    """The one real compile: N identical blocks -> 1 inductor graph; compiled output repeatable."""
    torch.manual_seed(0)
    m = Tiny(n=4).eval()
    x = torch.randn(1, 6, 8)
    with torch.inference_mode():
        eager = m(x)
        compiled = compile_blocks(m, block_paths(m), CompileOptions(dynamic=False))
        t0 = time.perf_counter()
        with swap_in(m, compiled):
            first = m(x)
        first_s = time.perf_counter() - t0
        with swap_in(m, compiled):
            second = m(x)
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["inductor"]["fxgraph_cache_hit"] + counters["inductor"]["fxgraph_cache_miss"] >= 1
    assert torch.equal(first, second)  # run-to-run identical
    max_abs = (first - eager).abs().max().item()
    assert max_abs < 1e-4  # same maths; bit-equality with eager is NOT claimed
    with capsys.disabled():
        print(
            f"\n[inductor regional] first call {first_s:.2f} s, compiled vs eager: "
            f"bit-equal={torch.equal(first, eager)}, max|d|={max_abs:.3g}"
        )


def test_compiled_blocks_are_only_for_the_model_they_were_made_from() -> None:
    """A multi-GPU clone (ComfyUI 0.33's ``multigpu_clones``: a deep copy on another device) must not get the
    original's compiled blocks swapped in: ``compiled_for`` tells them apart (the adapter then runs the copy's own
    blocks)."""
    import copy

    from steadfast.core.compile.options import CompileOptions
    from steadfast.core.compile.swap import compile_blocks, compiled_for

    model = Tiny()
    compiled = compile_blocks(model, block_paths(model), CompileOptions(backend="eager"))
    assert compiled_for(model, compiled)
    assert not compiled_for(copy.deepcopy(model), compiled)
    assert not compiled_for(Tiny(n=2), compiled)  # another model without those paths
