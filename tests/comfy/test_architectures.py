"""Regional compilation on ComfyUI's own model classes, plus unit tests of ``core/compile/blocks.py``.

ComfyUI is imported ONLY in a subprocess (``tests/comfy/arch_worker.py``, which prints JSON); this
process never imports ``comfy``. Tests that need it take the ``comfyui_path`` fixture and are skipped
loudly without a ComfyUI checkout. The unit tests at the bottom use synthetic modules.

What is measured (numbers come from the worker, nothing is assumed):

* structure (real-size configs on the meta device, 60 architectures of ComfyUI 0.8.0 and 0.33.0, one test
  each; those the running ComfyUI lacks are skipped, the reason naming its version): the declared blocks are all
  found (count read from the model's own containers), swappable, and auto-discovery picks the same
  blocks except for the documented differences in ``KNOWN_AUTO_DIFF``; unsupported ones say why;
* small seeded SD1.5 / SDXL-shaped / Flux / SD3 / Wan models (``backend="eager"``): every declared block
  compiled, output depends on the input, compiled output run-to-run identical and compared with eager
  (max |d| reported), graphs on the first call == structural variants (no wasted recompile), and no
  recompile after the first call, with ``dynamic=None`` and ``dynamic=True``;
* the two first-call recompile fixes (``CompileOptions.contiguous_inputs`` / ``specialize_ints``):
  without them the same models compile extra graphs (Dynamo's reasons are checked);
* ``comfy_guard_filter``: a per-block attn2 patch added after warm-up is applied (ComfyUI-style
  ``SkipGuardsOn`` silently ignores it; measured);
* the swap table (``NON_GENERIC_PARENTS``, by which ``swap_refusal`` judges ComfyUI's callers without reading
  source): every chosen block swapped for a plain wrapper is called and changes nothing, children of each row's
  caller swapped alone change the result (arch_worker ``swaptable``); no caller of a chosen block dispatches on its
  class (``caller_dispatch``, per architecture);
* ``slow``: the same with ``backend="inductor"`` for Flux and Wan.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from steadfast.core.compile import blocks as sblocks
from steadfast.core.compile.guards import SkipGuardsOn, TransformerOptionsGuardFilter, comfy_guard_filter
from steadfast.core.compile.options import CompileOptions
from steadfast.core.compile.swap import compile_blocks, contiguous_inputs_hook, swap_in

WORKER = Path(__file__).with_name("arch_worker.py")
ARCHS = ["sd15", "sdxl", "flux", "sd3", "wan"]
EXPECTED = {  # blocks in the small models (from their configs, see arch_worker.small_*)
    "sd15": {"BasicTransformerBlock": 7},
    "sdxl": {"BasicTransformerBlock": 8},
    "flux": {"DoubleStreamBlock": 2, "SingleStreamBlock": 3},
    "sd3": {"JointBlock": 4},
    "wan": {"WanAttentionBlock": 3},
}
# Auto-discovery vs the declared table on real-size models: (extra classes auto adds, declared classes
# auto leaves out). Everything else must match path for path.
KNOWN_AUTO_DIFF = {
    "chroma_radiance": ({"NerfGLUBlock"}, set()),  # per-pixel NeRF head, left out on purpose
    "wan_vace": ({"VaceWanAttentionBlock"}, set()),  # int block_id -> one graph per block (measured)
    "wan_s2v": ({"WanT2VCrossAttention"}, set()),  # audio injector attention layers
    "kandinsky5": (set(), {"TransformerEncoderBlock"}),  # 2 text blocks = 4.4% of params < 5% cut
    "hidream_o1": ({"Qwen35VisionBlock"}, set()),  # reference-image ViT, its output cached across steps
    "wan_dancer": ({"WanT2VCrossAttention"}, set()),  # music injector attention layers (as wan_s2v's audio)
}
REL_TOL = 1e-3
#: The worker's structure architectures (arch_worker.STRUCTURE; the worker imports ComfyUI, this process may not):
#: one test each. Those newer than the running ComfyUI are skipped by the worker, with its version in the reason.
STRUCTURE_ARCHS = [
    "sd15",
    "sdxl",
    "flux",
    "flux2",
    "chroma",
    "chroma_radiance",
    "hunyuan_video",
    "hunyuan3d",
    "sd3",
    "sd35",
    "auraflow",
    "wan",
    "wan_i2v",
    "wan_vace",
    "wan_camera",
    "wan_s2v",
    "wan_humo",
    "wan_animate",
    "ltxv",
    "ltxav",
    "lumina2",
    "qwen_image",
    "hidream",
    "pixart",
    "hunyuan_dit",
    "hunyuan3d21",
    "mochi",
    "cosmos",
    "cosmos_predict2",
    "ace",
    "stable_audio",
    "kandinsky5",
    "omnigen2",
    "stable_cascade_c",
    "stable_cascade_b",
    # new in ComfyUI 0.33.0 (skipped on older ones)
    "anima",
    "ace15",
    "boogu",
    "cogvideox",
    "ernie",
    "hidream_o1",
    "ideogram4",
    "joyimage",
    "krea2",
    "lens",
    "zimage_pixel",
    "mage_flow",
    "minimax_h3",
    "minimax_music3",
    "pixeldit",
    "pid",
    "seedvr2",
    "trellis2",
    "triposplat",
    "wan_causal",
    "wan_scail",
    "wan_scail2",
    "wan_dancer",
    "wan_animate2",
    "zimage_omni",
    "ltxav_switches",
]
#: ``{arch: text its REGIONAL_UNSUPPORTED reason contains}``
UNSUPPORTED_ARCHS = {
    "stable_cascade_c": "isinstance",
    "stable_cascade_b": "isinstance",
    "wan_animate2": "block.forward_gen",
}


def _worker(comfyui_path: Path, *args: str, timeout: int = 900, **env_extra: str) -> dict[str, Any]:
    env = dict(os.environ, COMFYUI_PATH=str(comfyui_path), **env_extra)
    proc = subprocess.run(
        [sys.executable, str(WORKER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(WORKER.parent),
    )
    if proc.returncode != 0:
        raise AssertionError(f"worker {args} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def structure(comfyui_path: Path) -> dict[str, Any]:
    return _worker(comfyui_path, "structure")


@pytest.fixture(scope="module")
def swap_runs(comfyui_path: Path) -> dict[str, Any]:
    return _worker(comfyui_path, "swaptable")


@pytest.fixture(scope="module")
def eager_runs(comfyui_path: Path) -> dict[str, Any]:
    """One worker process: the 5 small models with the defaults (dynamic=None), dynamic=True, and
    three runs without the first-call fixes."""
    items = (
        ARCHS
        + [f"{a}:dynamic=true" for a in ("sd15", "flux", "wan")]
        + ["sd15:specialize=0", "sd3:contiguous=0", "wan:contiguous=0", "sd15:patch=1", "sd15:patch=1,filter=skip"]
    )
    return _worker(comfyui_path, "run", "--backend", "eager", *items)


def _report(title: str, rows: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print(f"\n[{title}]")
        for k, r in rows.items():
            print(f"  {k:22s} {r}")


# ---- structure: declared table vs the real models ---------------------------------------------
def _built(structure: dict[str, Any], arch: str) -> dict[str, Any]:
    """The worker's row for ``arch``; skipped (reason from the worker, naming the running ComfyUI's version) where
    the architecture is newer than it; an error row fails here with the worker's message (no KeyError later)."""
    r = structure[arch]
    if "skipped" in r:
        assert structure["comfyui_version"] in r["skipped"], r["skipped"]
        pytest.skip(r["skipped"])
    assert "error" not in r, (arch, r["error"])
    return r


@pytest.mark.comfyui
def test_structure_covers_every_listed_architecture(structure: dict[str, Any], capsys) -> None:
    archs = {k: v for k, v in structure.items() if isinstance(v, dict)}
    assert sorted(archs) == sorted(STRUCTURE_ARCHS)  # the parametrized tests below cover the worker's list
    built = {k: v for k, v in archs.items() if "skipped" not in v and "error" not in v}
    assert len(built) >= 30, sorted(built)
    _report(
        f"declared blocks (real-size configs, meta device, ComfyUI {structure['comfyui_version']})",
        {
            k: v.get("skipped") or v.get("error") or f"{v['class']}: {v.get('found')} variants={v.get('variants')}"
            for k, v in archs.items()
        },
        capsys,
    )


@pytest.mark.comfyui
@pytest.mark.parametrize("arch", STRUCTURE_ARCHS)
def test_declared_blocks_found(structure: dict[str, Any], arch: str) -> None:
    r = _built(structure, arch)
    if arch in UNSUPPORTED_ARCHS:
        assert r["how"] == "unsupported" and UNSUPPORTED_ARCHS[arch] in r["reason"], (arch, r)
        assert r["paths"] == []
        # where repeated blocks exist (counted from the model's containers), auto-discovery would pick them:
        # the table's row is what keeps them from being swapped
        assert r["expected"].items() <= r["auto_groups"].items(), (arch, r["expected"], r["auto_groups"])
        return
    assert r["how"] == "declared", (arch, r["how"], r["reason"])
    assert r["found"] == r["expected"], (arch, r["found"], r["expected"])
    assert r["found"] and all(n > 0 for n in r["found"].values()), arch
    assert r["refused"] == {} and r["warnings"] == [], (arch, r["refused"], r["warnings"])


@pytest.mark.comfyui
@pytest.mark.parametrize("arch", [a for a in STRUCTURE_ARCHS if a not in UNSUPPORTED_ARCHS])
def test_auto_discovery_picks_the_declared_level(structure: dict[str, Any], arch: str) -> None:
    r = _built(structure, arch)
    assert r["auto_check_ok"], arch  # every auto-chosen block is swappable
    if arch not in KNOWN_AUTO_DIFF:
        assert r["auto_equals_declared"], (arch, r["auto_groups"], r["found"])
        return
    extra, missing = KNOWN_AUTO_DIFF[arch]
    auto, declared = set(r["auto_groups"]), set(r["found"])
    assert auto - declared == extra and declared - auto == missing, (arch, r["auto_groups"], r["found"])
    for cls in auto & declared:
        assert r["auto_groups"][cls] == r["found"][cls], (arch, cls)


@pytest.mark.comfyui
@pytest.mark.parametrize("arch", STRUCTURE_ARCHS)
def test_no_comfyui_caller_dispatches_on_a_chosen_block(structure: dict[str, Any], arch: str) -> None:
    """``swap_refusal`` judges ComfyUI's callers by ``NON_GENERIC_PARENTS`` alone: the table is complete only if no
    caller of a declared or auto-discovered block tests ``isinstance`` on the block's classes (this test reads
    ComfyUI's source, the product does not: it fails when ComfyUI adds such a dispatch the table lacks)."""
    r = _built(structure, arch)
    assert r["caller_dispatch"] == {}, (arch, r["caller_dispatch"])


@pytest.mark.comfyui
def test_swap_table_holds_on_comfyui(swap_runs: dict[str, Any]) -> None:
    """``NON_GENERIC_PARENTS`` against ComfyUI by running the small models (no source read; arch_worker
    ``swaptable``): every chosen block swapped for a wrapper that is not an instance of its class (as an
    ``OptimizedModule`` is not) is called and the output is bit-identical (the callers are generic); each table row
    met in these models (UNetModel, TimestepEmbedSequential) does dispatch by class: some child of it, swapped
    alone, changes the result or fails. Fails when ComfyUI makes a row's caller generic or a chosen one not."""
    rows: dict[str, list[bool]] = {}
    for arch in ARCHS:
        r = swap_runs[arch]
        assert "error" not in r, (arch, r)
        chosen = r["chosen"]
        assert chosen["count"] > 0 and chosen["error"] is None and chosen["uncalled"] == [] and chosen["equal"], (
            arch,
            chosen,
        )
        for path, fact in r["refused"].items():
            assert fact["caller"] in sblocks.NON_GENERIC_PARENTS, (arch, path, fact)
            rows.setdefault(fact["caller"], []).append(fact["changed"])
    assert set(rows) == {"UNetModel", "TimestepEmbedSequential"}, rows
    assert all(any(changed) for changed in rows.values()), rows
    assert all(rows["UNetModel"]), rows  # forward_timestep_embed iterates its blocks: a wrapper is not iterable


@pytest.mark.comfyui
def test_auto_discovery_searches_inside_the_unet_dispatch(structure: dict[str, Any]) -> None:
    # the UNet's outer level (input/output TimestepEmbedSequential) is refused, then searched inside
    for arch in ("sd15", "sdxl"):
        r = _built(structure, arch)
        assert r["auto_refused_count"] > 0
        assert "forward_timestep_embed" in next(iter(r["auto_refused_sample"].values()))


# ---- small seeded models, eager backend --------------------------------------------------------
def _check_run(name: str, r: dict[str, Any], expected: dict[str, int]) -> None:
    assert "error" not in r, (name, r.get("error"), r.get("traceback"))
    assert r["how"] == "declared" and r["found"] == expected, (name, r["found"])
    assert r["seeded_tensors"] > 0 and r["finite"], name
    assert r["depends_on_input"], name
    assert r["run_to_run_equal"], name
    assert r["rel_vs_eager"] < REL_TOL, (name, r["max_abs_vs_eager"], r["rel_vs_eager"])
    assert r["recompiles_after_first_call"] == [], (name, r["recompiles_after_first_call"])
    assert len(set(r["graphs_after_call"])) == 1, (name, r["graphs_after_call"])  # nothing compiled later


@pytest.mark.comfyui
def test_small_models_regional_eager_backend(eager_runs: dict[str, Any], capsys) -> None:
    rows = {}
    for arch in ARCHS:
        r = eager_runs[arch]
        _check_run(arch, r, EXPECTED[arch])
        # one graph per structural variant: no first-call recompile beyond what the blocks' own
        # structure requires (sd15: 2 widths; sd3: a self-attn block and the pre_only last block)
        assert r["graphs_after_call"][0] == sum(r["variants"].values()), (
            arch,
            r["graphs_after_call"],
            r["variants"],
            r["recompiles_first_call"],
        )
        # the eager backend replays the same aten ops: measured bit-equal to the eager model
        assert r["bit_equal_eager"], (arch, r["max_abs_vs_eager"])
        rows[arch] = (
            f"blocks={r['found']} graphs={r['graphs_after_call'][0]} max|d|={r['max_abs_vs_eager']:.3g} "
            f"bit-equal={r['bit_equal_eager']} first call {r['calls_seconds'][0]:.2f}s"
        )
    _report("regional compile, backend=eager, dynamic=None", rows, capsys)


@pytest.mark.comfyui
def test_small_models_dynamic_true_stay_at_zero_recompiles(eager_runs: dict[str, Any]) -> None:
    for arch in ("sd15", "flux", "wan"):
        r = eager_runs[f"{arch}:dynamic=true"]
        _check_run(f"{arch}:dynamic=true", r, EXPECTED[arch])
        assert r["options"]["dynamic"] is True
        assert r["graphs_after_call"][0] == sum(r["variants"].values()), (arch, r["recompiles_first_call"])


@pytest.mark.comfyui
def test_first_call_recompiles_without_the_fixes(eager_runs: dict[str, Any], capsys) -> None:
    """The extra graphs the options remove are real: Dynamo names strides and transformer_options ints."""
    rows = {}
    for item, needle in [
        ("wan:contiguous=0", "stride mismatch"),
        ("sd3:contiguous=0", "stride mismatch"),
        ("sd15:specialize=0", "transformer_options['block']"),
    ]:
        r = eager_runs[item]
        arch = item.split(":")[0]
        _check_run(item, r, EXPECTED[arch])  # still correct and warm-stable, just more graphs
        fixed = eager_runs[arch]
        assert r["graphs_after_call"][0] > fixed["graphs_after_call"][0], (item, r["graphs_after_call"])
        assert any(needle in m for m in r["recompiles_first_call"]), (item, r["recompiles_first_call"])
        assert not any(needle in m for m in fixed["recompiles_first_call"]), (arch, fixed["recompiles_first_call"])
        rows[item] = f"graphs {r['graphs_after_call'][0]} -> {fixed['graphs_after_call'][0]} with the fix"
    _report("first-call recompiles removed", rows, capsys)


@pytest.mark.comfyui
def test_patch_added_after_warmup_is_applied(eager_runs: dict[str, Any], capsys) -> None:
    """An attn2 replace patch on one UNet block (as IPAdapter sets) added after the blocks were compiled.

    comfy_guard_filter keeps the guards that notice it: compiled == eager with the patch (recompiling,
    possibly past the recompile limit, i.e. partly eager). ComfyUI-style SkipGuardsOn drops them: the
    warm graph runs and the patch is silently ignored (measured, asserted here as the reason for the filter).
    """
    good, bad = eager_runs["sd15:patch=1"], eager_runs["sd15:patch=1,filter=skip"]
    for r in (good, bad):
        _check_run("patch", r, EXPECTED["sd15"])
        assert r["patch"]["changes_output"]
        assert r["patch"]["max_abs_vs_eager_unpatched_after"] == 0.0  # eager backend, unpatched again
    assert good["patch"]["max_abs_vs_eager_patched"] == 0.0 and good["patch"]["recompiles"] > 0
    assert bad["patch"]["max_abs_vs_eager_patched"] > 1e-4 and bad["patch"]["recompiles"] == 0
    _report(
        "attn2 patch added after warm-up",
        {
            "comfy_guard_filter": f"max|d| vs eager+patch = {good['patch']['max_abs_vs_eager_patched']:.3g} "
            f"({good['patch']['recompiles']} recompiles)",
            "SkipGuardsOn": f"max|d| vs eager+patch = {bad['patch']['max_abs_vs_eager_patched']:.3g} (patch ignored)",
        },
        capsys,
    )


@pytest.mark.slow
@pytest.mark.comfyui
def test_inductor_flux_and_wan(comfyui_path: Path, tmp_path: Path, capsys) -> None:
    runs = _worker(
        comfyui_path,
        "run",
        "--backend",
        "inductor",
        "flux",
        "wan",
        "flux:dynamic=true",
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )  # cold: a fresh cache
    rows = {}
    for item in ("flux", "wan", "flux:dynamic=true"):
        r = runs[item]
        _check_run(item, r, EXPECTED[item.split(":")[0]])
        assert r["graphs_after_call"][0] == sum(r["variants"].values()), (item, r["recompiles_first_call"])
        rows[item] = (
            f"graphs={r['graphs_after_call'][0]} bit-equal={r['bit_equal_eager']} "
            f"max|d|={r['max_abs_vs_eager']:.3g} rel={r['rel_vs_eager']:.3g} "
            f"first call {r['calls_seconds'][0]:.1f}s, then {r['calls_seconds'][-1] * 1e3:.1f} ms"
        )
    _report("regional compile, backend=inductor", rows, capsys)


@pytest.mark.slow  # importing diffusers alone can take ~30 s on this machine
@pytest.mark.parametrize("dynamic", [None, True])
def test_diffusers_flux_single_blocks_no_stride_recompile(dynamic: bool | None) -> None:
    """Diffusers' Flux hands its first single block a
    fresh tensor and the others a slice (stride[0] differs on a size-1 dim) -> one extra graph on the
    first call. ``contiguous_inputs`` removes it; outputs stay bit-equal to eager (eager backend)."""
    diffusers = pytest.importorskip("diffusers")

    torch.manual_seed(0)
    m = diffusers.FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=3,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=(4, 6, 6),
    ).eval()
    paths = sblocks.choose_blocks(m, classes=m._repeated_blocks).paths  # diffusers' declaration
    assert len(paths) == 4
    graphs = {}
    with torch.inference_mode():
        g = torch.Generator().manual_seed(0)
        inp = dict(
            hidden_states=torch.randn(1, 64, 16, generator=g),
            encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
            pooled_projections=torch.randn(1, 32, generator=g),
            timestep=torch.tensor([0.5]),
            img_ids=torch.zeros(64, 3),
            txt_ids=torch.zeros(8, 3),
            return_dict=False,
        )
        eager = m(**inp)[0]
        for on in (False, True):
            torch._dynamo.reset()
            counters.clear()
            compiled = compile_blocks(m, paths, CompileOptions(backend="eager", dynamic=dynamic, contiguous_inputs=on))
            outs = []
            for _ in range(3):
                with swap_in(m, compiled):
                    outs.append(m(**inp)[0])
            graphs[on] = counters["stats"]["unique_graphs"]
            assert all(torch.equal(o, eager) for o in outs)
    assert graphs == {False: 3, True: 2}, graphs  # double + single; without the hook a 2nd single graph


# ---- unit tests of core/compile/blocks.py and the compile options (no ComfyUI) --------------------------
class Leaf(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.lin(x)


class DispatchedLeaf(Leaf):
    """Called with a different signature by :class:`Dispatcher` (another pack's caller: found by the source scan)."""

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:  # type: ignore[override]
        return x + scale * self.lin(x)


class Dispatcher(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([DispatchedLeaf(), DispatchedLeaf(), Leaf()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, scale=0.5) if isinstance(layer, DispatchedLeaf) else layer(x)
        return x


class TimestepEmbedSequential(nn.Sequential):  # same name as ComfyUI's dispatcher: refused by name
    pass


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Leaf(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.transformer_blocks = nn.ModuleList([Leaf(32)])  # one per list, repeated model-wide


class UNetModel(nn.Module):  # named like ComfyUI's: its direct container children are refused
    def __init__(self) -> None:
        super().__init__()
        self.input_blocks = nn.ModuleList([TimestepEmbedSequential(Leaf(), Inner()) for _ in range(2)])


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wrapped = nn.ModuleList([Wrapper(), Wrapper()])
        self.tiny = nn.ModuleList([nn.Linear(8, 1, bias=False), nn.Linear(8, 1, bias=False)])


def test_declaration_walks_mro_and_qualified_names() -> None:
    Aura = type("MMDiT", (nn.Module,), {"__module__": "comfy.ldm.aura.mmdit"})
    Sd3 = type("MMDiT", (nn.Module,), {"__module__": "comfy.ldm.modules.diffusionmodules.mmdit"})
    assert sblocks.declaration(Aura) == (("MMDiTBlock", "DiTBlock"), None)
    assert sblocks.declaration(Sd3) == (("JointBlock",), None)
    assert sblocks.declaration(type("OpenAISignatureMMDITWrapper", (Sd3,), {})) == (("JointBlock",), None)
    Wan = type("WanModel", (nn.Module,), {})
    assert sblocks.declaration(type("CameraWanModel", (Wan,), {})) == (("WanAttentionBlock",), None)
    # a subclass's own row (ComfyUI 0.33.0) wins over its base's, an unsupported one too
    assert sblocks.declaration(type("CausalWanModel", (Wan,), {})) == (("CausalWanAttentionBlock",), None)
    blocks, reason = sblocks.declaration(type("WanAnimate2Model", (Wan,), {}))
    assert blocks == () and "forward_gen" in reason
    assert sblocks.declaration(type("Unknown", (nn.Module,), {})) == (None, None)
    blocks, reason = sblocks.declaration(type("StageC", (nn.Module,), {}))
    assert blocks == () and "isinstance" in reason


def test_safe_to_swap_refuses_isinstance_dispatch_and_counts_variants() -> None:
    d = Dispatcher()
    check = sblocks.safe_to_swap(d, ["layers.0", "layers.1", "layers.2"])
    assert check.safe == ["layers.2"] and set(check.refused) == {"layers.0", "layers.1"}
    assert "isinstance(..., DispatchedLeaf)" in check.refused["layers.0"]
    seq = nn.Module()
    seq.ts = nn.ModuleList([TimestepEmbedSequential(Leaf(), Leaf())])
    assert "forward_timestep_embed" in sblocks.safe_to_swap(seq, ["ts.0.0"]).refused["ts.0.0"]
    # structural variants: two widths of Leaf -> 2 graphs of Leaf.forward; warning past the limit
    mixed = nn.Module()
    mixed.blocks = nn.ModuleList([Leaf(8), Leaf(8), Leaf(16)])
    check = sblocks.safe_to_swap(mixed, ["blocks.0", "blocks.1", "blocks.2"], recompile_limit=1)
    assert not check.refused and check.variants == {"Leaf": 2} and len(check.warnings) == 1
    assert sblocks.safe_to_swap(mixed, ["blocks.0", "blocks.1"]).warnings == []
    with pytest.raises(ValueError):
        sblocks.safe_to_swap(mixed, ["blocks.7"])


def test_comfy_callers_are_judged_by_the_table_alone() -> None:
    """A caller from ComfyUI (``comfy.*``) is refused only by a ``NON_GENERIC_PARENTS`` row, never by reading its
    source; another pack's caller (here: this test module's :class:`Dispatcher`) is still scanned."""
    comfy_dispatcher = type("Dispatcher", (Dispatcher,), {"__module__": "comfy.ldm.not_a_module"})()
    assert sblocks.safe_to_swap(comfy_dispatcher, ["layers.0", "layers.1"]).refused == {}
    assert set(sblocks.safe_to_swap(Dispatcher(), ["layers.0", "layers.1"]).refused) == {"layers.0", "layers.1"}
    assert sblocks.isinstance_dispatch(Dispatcher, DispatchedLeaf)
    assert not sblocks.isinstance_dispatch(Dispatcher, Leaf)
    named = type("TimestepEmbedSequential", (nn.Sequential,), {"__module__": "comfy.ldm.not_a_module"})
    seq = nn.Module()
    seq.ts = nn.ModuleList([named(Leaf(), Leaf())])
    assert "forward_timestep_embed" in sblocks.swap_refusal(seq, "ts.0.0")


def test_discovery_descends_past_refused_unwraps_and_drops_small_groups() -> None:
    m = UNetModel()
    disc = sblocks.choose_blocks(m, discover=True).discovery
    assert set(disc.refused) == {"input_blocks.0", "input_blocks.1"}  # UNetModel is a non-generic caller
    # one Leaf(32) per list, but repeated model-wide: found inside the refused outer blocks
    assert disc.paths == ["input_blocks.0.1.transformer_blocks.0", "input_blocks.1.1.transformer_blocks.0"]
    # a declared model whose declared classes are absent falls back to discovery, and says so
    choice = sblocks.choose_blocks(m)
    assert choice.how == "auto-discovered" and "BasicTransformerBlock" in choice.reason
    assert choice.paths == disc.paths and choice.classes == {"Leaf": 2}

    p = Plain()
    disc = sblocks.choose_blocks(p, discover=True).discovery
    assert disc.groups == {"Leaf": ["wrapped.0.block", "wrapped.1.block"]}  # Wrapper -> its only child
    assert disc.dropped == {"Linear": pytest.approx(16 / sum(t.numel() for t in p.parameters()), abs=1e-4)}
    assert sblocks.choose_blocks(p, discover=True, min_param_share=0.0).discovery.groups["Linear"] == [
        "tiny.0",
        "tiny.1",
    ]
    with pytest.raises(ValueError):
        sblocks.choose_blocks(p, discover=True, min_repeats=0)


def test_choose_blocks_unknown_model_is_auto_discovered_and_reported() -> None:
    m = Dispatcher()
    choice = sblocks.choose_blocks(m)
    # the two DispatchedLeafs are refused (isinstance in the caller), the single Leaf is not repeated
    assert choice.how == "auto-discovered" and choice.paths == [] and choice.discovery is not None
    assert set(choice.discovery.refused) == {"layers.0", "layers.1"}
    m2 = nn.Module()
    m2.blocks = nn.ModuleList([Leaf(), Leaf(), Leaf()])
    choice = sblocks.choose_blocks(m2)
    assert choice.paths == ["blocks.0", "blocks.1", "blocks.2"] and choice.classes == {"Leaf": 3}
    assert "3 blocks (auto-discovered): 3 x Leaf" in choice.as_text()
    json.dumps(dataclasses.asdict(choice))  # plain data, serialisable for reports


def test_contiguous_inputs_hook() -> None:
    base = torch.randn(1, 12, 4)
    transposed = torch.randn(1, 4, 6).transpose(1, 2)  # dense but not row-major
    sliced = base[:, 4:]  # is_contiguous() is True, but stride[0] is 48, not 32
    assert sliced.is_contiguous() and sliced.stride() == (48, 4, 1)
    expanded = torch.randn(1, 1, 4).expand(1, 6, 4)
    plain = torch.randn(2, 3)
    assert contiguous_inputs_hook(None, (plain,), {"x": plain, "opts": {"t": transposed}}) is None
    args, kwargs = contiguous_inputs_hook(None, (transposed, [plain, sliced]), {"e": expanded, "s": sliced, "n": 3})
    assert args[0].stride() == (24, 4, 1) and torch.equal(args[0], transposed)
    assert args[1][0] is plain and args[1][1].stride() == (32, 4, 1) and torch.equal(args[1][1], sliced)
    assert type(args[1]) is list
    assert kwargs["e"] is expanded and kwargs["n"] == 3  # broadcast views are never materialised
    assert kwargs["s"].stride() == (32, 4, 1) and torch.equal(kwargs["s"], sliced)


class ContiguousLeaf(Leaf):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()  # as Wan's WanAttentionBlock does: its output is contiguous
        return x + self.lin(x)


class StridedFirst(nn.Module):
    """The first block gets a transposed view (like Wan/SD3), the others contiguous outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([ContiguousLeaf(8) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        for b in self.blocks:
            x = b(x)
        return x


class IndexedBlock(nn.Module):
    """Reads a per-block int from transformer_options as a dict key, as ComfyUI's blocks do."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, transformer_options: dict) -> torch.Tensor:
        replace = transformer_options.get("patches_replace", {})
        key = ("block", transformer_options["block_index"])
        return x + (replace[key](x) if key in replace else self.lin(x))


class Indexed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([IndexedBlock() for _ in range(4)])

    def forward(self, x: torch.Tensor, transformer_options: dict) -> torch.Tensor:
        for i, b in enumerate(self.blocks):
            if i == 2:  # a second resolution, like a UNet level: one legitimate recompile
                x = x[:, ::2].contiguous()
            transformer_options["block_index"] = i
            x = b(x, transformer_options=transformer_options)
        return x


@pytest.mark.parametrize("dynamic", [None, True])
def test_compile_options_remove_first_call_recompiles(dynamic: bool | None) -> None:
    torch.manual_seed(0)
    cases = [
        (StridedFirst().eval(), lambda m, x: m(x), "contiguous_inputs", (2, 8, 5)),
        (Indexed().eval(), lambda m, x: m(x, {}), "specialize_ints", (2, 5, 8)),
    ]
    for model, call, option, shape in cases:
        with torch.inference_mode():  # inputs too: a non-inference input alone is a guard failure
            x = torch.randn(*shape)
            eager = call(model, x)
            assert not torch.equal(eager, call(model, torch.randn(*shape)))
            graphs = {}
            for on in (False, True):
                torch._dynamo.reset()
                counters.clear()
                opts = CompileOptions(backend="eager", dynamic=dynamic, **{option: on})
                compiled = compile_blocks(
                    model, [f"blocks.{i}" for i in range(len(model.blocks))], opts, comfy_guard_filter()
                )
                outs = []
                for _ in range(3):
                    with swap_in(model, compiled):
                        outs.append(call(model, x))
                graphs[on] = counters["stats"]["unique_graphs"]
                assert all(torch.equal(o, eager) for o in outs), option  # eager backend: same ops, same bits
        # with the option: 1 graph (Indexed with dynamic=None: 2, its second resolution)
        expected = 2 if (option == "specialize_ints" and dynamic is None) else 1
        assert graphs[True] == expected and graphs[False] > expected, (option, dynamic, graphs)
    torch._dynamo.reset()
    assert torch._dynamo.config.specialize_int is False  # the per-call patch was restored


def test_compile_options_new_fields_stay_out_of_torch_compile() -> None:
    o = CompileOptions(backend="eager", contiguous_inputs=False, specialize_ints=False)
    assert "contiguous_inputs" not in o.to_kwargs() and "specialize_ints" not in o.to_kwargs()
    d = o.as_dict()
    assert d["contiguous_inputs"] is False and d["specialize_ints"] is False
    assert CompileOptions() != o and CompileOptions().contiguous_inputs and CompileOptions().specialize_ints


def test_transformer_options_guard_filter_decisions() -> None:
    class Entry:  # the fields of torch._dynamo.types.GuardFilterEntry the filter reads
        def __init__(self, name: str, value: Any = None) -> None:
            self.name, self.has_value, self.value = name, value is not None, value

    f = comfy_guard_filter()
    assert f == TransformerOptionsGuardFilter() and hash(f) == hash(TransformerOptionsGuardFilter())
    plain = {"block": ("input", 1), "sigmas": 1.0, "patches_replace": {"attn1": {}}}
    names = [
        "x",
        "transformer_options",
        "L['transformer_options']['block'][1]",
        "transformer_options['sigmas']",
        "transformer_options['patches_replace']['attn1']",
        "transformer_options['optimized_attention_override']",
    ]
    entries = [Entry(names[0]), Entry(names[1], plain)] + [Entry(n) for n in names[2:]]
    assert f(entries) == [True, True, False, False, True, True]
    patched = dict(plain, patches_replace={"attn1": {("input", 1, 0): print}})
    entries[1] = Entry(names[1], patched)
    assert f(entries) == [True] * 6  # a patch may read anything: keep every guard
    assert SkipGuardsOn()(entries) == [True, False, False, False, False, False]


def test_guard_filter_keeps_per_block_patches_correct() -> None:
    """A per-block patch (looked up by block index inside the compiled block) added after warm-up."""
    torch.manual_seed(0)
    model = Indexed().eval()

    def patch(x: torch.Tensor) -> torch.Tensor:
        return 3.0 * x

    results = {}
    for name, gfilter in (("comfy", comfy_guard_filter()), ("skip", SkipGuardsOn())):
        torch._dynamo.reset()
        with torch.inference_mode():
            x = torch.randn(2, 6, 8)
            eager, eager_patched = model(x, {}), model(x, {"patches_replace": {("block", 3): patch}})
            assert not torch.equal(eager, eager_patched)
            paths = [f"blocks.{i}" for i in range(4)]
            compiled = compile_blocks(model, paths, CompileOptions(backend="eager"), gfilter)
            with swap_in(model, compiled):
                warm = model(x, {})
                late = model(x, {"patches_replace": {("block", 3): patch}})
                again = model(x, {})
        results[name] = (torch.equal(warm, eager), torch.equal(late, eager_patched), torch.equal(again, eager))
    torch._dynamo.reset()
    assert results["comfy"] == (True, True, True)
    assert results["skip"] == (True, False, True)  # the patch is silently ignored: why the new filter exists
