"""Which blocks regional compilation compiles in each ComfyUI diffusion model, and a runtime safety check.

The idea is diffusers' ``_repeated_blocks`` (declared per model class, used by
``compile_repeated_blocks``), applied to ComfyUI's own model classes by *class name*, so this module
imports nothing from ComfyUI. A compiled block is swapped in for the original (an ``OptimizedModule``
in its parent's ``ModuleList``/``ModuleDict`` slot, see :func:`core.compile.swap_in`). That is only
correct when the parent calls the block *generically* (``block(...)``): an ``OptimizedModule``
forwards attribute reads to the original (``__getattr__``), but ``isinstance(block, Cls)`` is False.
Every entry below was checked by reading the parent's ``forward`` in ComfyUI v0.8.0
(``comfy/ldm/**``); the comment names the file and the call.

Adapters call :func:`choose_blocks`: the declared classes when the model is in the table, else
:func:`discover_blocks` (repeated children of ``nn.ModuleList``/``nn.ModuleDict`` containers, at the
level the table would pick: refused outer blocks are searched inside, pure wrappers unwrapped, tiny
groups dropped); the choice and how it was made are reported. :func:`safe_to_swap` checks any choice
at runtime (known non-generic callers, ``isinstance`` on the block's class in the caller's source
file) and counts structural variants (each one more Dynamo graph of the same ``forward``).
Tests: ``tests/comfy/test_architectures.py`` builds every model below (real-size configs on the meta
device) and runs small seeded SD1.5/SDXL/Flux/SD3/Wan instances under regional compile.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from . import torch_compat

__all__ = [
    "COMFY_REPEATED_BLOCKS",
    "REGIONAL_UNSUPPORTED",
    "NON_GENERIC_PARENTS",
    "declared_blocks_for",
    "regional_unsupported_reason",
    "SwapCheck",
    "safe_to_swap",
    "Discovery",
    "discover_blocks",
    "BlockChoice",
    "choose_blocks",
]

_FLUX_BLOCKS = ("DoubleStreamBlock", "SingleStreamBlock")

# Key: the diffusion model's class ``__name__``, or ``"module.QualName"`` where two ComfyUI classes
# share a name (both SD3 and AuraFlow call theirs ``MMDiT``). Value: block class ``__name__``s,
# matched inside that model only (outermost match wins). Verified parent call sites (v0.8.0):
COMFY_REPEATED_BLOCKS: dict[str, tuple[str, ...]] = {
    # SD1.x / SD2.x / SDXL / SVD / SD x4 upscaler / Lotus. modules/attention.py
    # SpatialTransformer.forward: `block(x, context=context[i], transformer_options=...)`;
    # SpatialVideoTransformer.forward: `block(x, context=..., ...)`, `mix_block(x_mix, context=...)`.
    # NOT SpatialTransformer/ResBlock/TimestepEmbedSequential: openaimodel.forward_timestep_embed
    # dispatches on isinstance(layer, SpatialTransformer/TimestepBlock/...), and UNetModel._forward
    # passes whole input/output blocks to it, which iterates them (see NON_GENERIC_PARENTS).
    "UNetModel": ("BasicTransformerBlock",),
    # Flux.1 / Flux.2 / Kontext. flux/model.py Flux.forward_orig: `block(img=..., txt=..., vec=..., pe=...)`
    # and `block(img, vec=..., pe=...)` (also inside the patches_replace `block_wrap` closures).
    "Flux": _FLUX_BLOCKS,
    # chroma/model.py Chroma.forward_orig: same calls as Flux (vec = per-block modulation slices).
    "Chroma": _FLUX_BLOCKS,
    # chroma_radiance/model.py (subclass of Chroma): same double/single loops. Its NerfGLUBlocks
    # (per-pixel MLP, tiled with varying tile counts) are left out on purpose.
    "ChromaRadiance": _FLUX_BLOCKS,
    # HunyuanVideo / 1.5 / HunyuanImage 2.1. hunyuan_video/model.py forward_orig: `block(img=..., txt=...)`,
    # `block(img, vec=..., pe=...)`. TokenRefinerBlocks (2, text only) are not compiled.
    "HunyuanVideo": _FLUX_BLOCKS,
    # hunyuan3d/model.py Hunyuan3Dv2.forward: flux blocks, plain calls.
    "Hunyuan3Dv2": _FLUX_BLOCKS,
    # SD3 / SD3.5. modules/diffusionmodules/mmdit.py MMDiT.forward_core_with_concat:
    # `self.joint_blocks[i](context, x, c=c_mod, ...)` (index access returns the swapped-in block).
    # The last block is pre_only and SD3.5 has x_block_self_attn blocks: 2-3 graphs on the first call.
    "comfy.ldm.modules.diffusionmodules.mmdit.MMDiT": ("JointBlock",),
    "OpenAISignatureMMDITWrapper": ("JointBlock",),
    # AuraFlow. aura/mmdit.py MMDiT.forward: `layer(c, x, global_cond, ...)`, `layer(cx, global_cond, ...)`.
    "comfy.ldm.aura.mmdit.MMDiT": ("MMDiTBlock", "DiTBlock"),
    # Wan 2.1 / 2.2 (t2v, i2v, camera, s2v, animate inherit it). wan/model.py WanModel.forward_orig:
    # `block(x, e=e0, freqs=..., context=..., ...)`. The first block gets a transposed (strided) x:
    # CompileOptions.contiguous_inputs avoids its extra graph.
    "WanModel": ("WanAttentionBlock",),
    # VACE: the main blocks as Wan. Its VaceWanAttentionBlocks (`self.vace_blocks[ii](c[iii], x=...)`,
    # plain) branch on an int `block_id`, which Dynamo specialises: one graph per block -> past
    # recompile_limit it would silently run eagerly, so they are not listed.
    "VaceWanModel": ("WanAttentionBlock",),
    # HuMo: wan/model.py HumoWanModel.forward_orig: `block(x, e=..., ..., audio=audio, ...)`.
    "HumoWanModel": ("WanAttentionBlockAudio",),
    # LTX-Video. lightricks/model.py LTXVModel._process_transformer_blocks: `block(x, context=..., ...)`
    # (lightricks' own BasicTransformerBlock class, same name as the UNet's).
    "LTXVModel": ("BasicTransformerBlock",),
    # LTX-2 audio+video. lightricks/av_model.py: `vx, ax = block((vx, ax), v_context=..., ...)`.
    "LTXAVModel": ("BasicAVTransformerBlock",),
    # Lumina 2 / Z-Image. lumina/model.py NextDiT: `layer(cap_feats, cap_mask, ...)` (context_refiner),
    # `layer(x, padded_img_mask, ...)` (noise_refiner), `layer(img, mask, freqs_cis, adaln_input, ...)`
    # (layers). Refiners without modulation are a second graph.
    "NextDiT": ("JointTransformerBlock",),
    # Qwen-Image. qwen_image/model.py forward: `block(hidden_states=..., encoder_hidden_states=..., ...)`.
    "QwenImageTransformer2DModel": ("QwenImageTransformerBlock",),
    # HiDream. hidream/model.py: the ModuleLists hold HiDreamImageBlock wrappers whose forward is
    # `return self.block(...)` (plain); the inner blocks are compiled. Their MoE feed-forward indexes
    # with boolean masks (data-dependent shapes): graph breaks, so fullgraph=True fails there.
    "HiDreamImageTransformer2DModel": ("HiDreamImageTransformerBlock", "HiDreamImageSingleTransformerBlock"),
    # PixArt alpha/sigma. pixart/pixartms.py: `block(x, y, t0, y_lens, (H, W), **kwargs)`.
    "PixArtMS": ("PixArtMSBlock",),
    # HunyuanDiT. hydit/models.py: `block(x, c, text_states, freqs_cis_img, skip)` (skip None in the
    # first half, a tensor in the second: 2 graphs).
    "HunYuanDiT": ("HunYuanDiTBlock",),
    # Hunyuan3D 2.1. hunyuan3dv2_1/hunyuandit.py: `block(combined, time_embedded, main_condition,
    # skip_tensor=...)`; MoE blocks (last layers) index with masks: graph breaks.
    "HunYuanDiTPlain": ("HunYuanDiTBlock",),
    # Mochi. genmo/joint_model/asymm_models_joint.py: `block(x, c, y_feat, rope_cos=..., ...)`.
    "AsymmDiTJoint": ("AsymmetricJointBlock",),
    # Cosmos 1 (GeneralDIT). cosmos/model.py: `for _, block in self.blocks.items(): x = block(x, ...)`
    # on an nn.ModuleDict; it also reads `block.x_format`, which OptimizedModule forwards.
    "GeneralDIT": ("GeneralDITTransformerBlock",),
    # Cosmos Predict2. cosmos/predict2.py MiniTrainDIT: `block(x_B_T_H_W_D, t_embedding_B_T_D, ...)`.
    "MiniTrainDIT": ("Block",),
    # ACE-Step. ace/model.py: `block(hidden_states=..., attention_mask=..., ...)`.
    "ACEStepTransformer2DModel": ("LinearTransformerBlock",),
    # Stable Audio. audio/dit.py ContinuousTransformer.forward: `layer(x, rotary_pos_emb=..., ...)`.
    "AudioDiffusionTransformer": ("TransformerBlock",),
    # Kandinsky 5. kandinsky5/model.py: `block(context, time_embed, freqs_text, ...)`,
    # `block(visual_embed, context, time_embed, freqs=..., ...)`.
    "Kandinsky5": ("TransformerEncoderBlock", "TransformerDecoderBlock"),
    # OmniGen2. omnigen/omnigen2.py: `layer(hidden_states, mask, rotary_emb, temb, ...)` (4 lists).
    "OmniGen2Transformer2DModel": ("OmniGen2TransformerBlock",),
}

# Models whose repeated blocks cannot be swapped for compiled wrappers (use a full compile).
REGIONAL_UNSUPPORTED: dict[str, str] = {
    "StageC": "Stable Cascade stage C dispatches its ResBlock/AttnBlock/TimestepBlock children with "
              "isinstance() (cascade/stage_c.py _down_encode/_up_decode); a compiled wrapper would be "
              "called without its conditioning. Use a full compile.",
    "StageB": "Stable Cascade stage B dispatches its ResBlock/AttnBlock/TimestepBlock children with "
              "isinstance() (cascade/stage_b.py _down_encode/_up_decode). Use a full compile.",
}

# Callers that do not call (some of) their children generically: a compiled wrapper in a child's slot
# would be called with the wrong arguments or not be callable the way the parent uses it.
NON_GENERIC_PARENTS: dict[str, str] = {
    "UNetModel": "UNetModel._forward passes input/middle/output blocks to forward_timestep_embed, which "
                 "iterates them (an OptimizedModule is not iterable) and dispatches on isinstance",
    "TimestepEmbedSequential": "openaimodel.forward_timestep_embed dispatches on isinstance(layer, "
                               "VideoResBlock/TimestepBlock/SpatialVideoTransformer/SpatialTransformer/Upsample)",
    "StageC": "cascade/stage_c.py dispatches on isinstance(block, ResBlock/AttnBlock/TimestepBlock)",
    "StageB": "cascade/stage_b.py dispatches on isinstance(block, ResBlock/AttnBlock/TimestepBlock)",
}


def _declaration(model_cls: type) -> tuple[tuple[str, ...] | None, str | None]:
    """(declared block names or None, unsupported reason or None) from the nearest declared class."""
    for klass in model_cls.__mro__:
        for key in (f"{klass.__module__}.{klass.__qualname__}", klass.__name__):
            if key in REGIONAL_UNSUPPORTED:
                return (), REGIONAL_UNSUPPORTED[key]
            if key in COMFY_REPEATED_BLOCKS:
                return COMFY_REPEATED_BLOCKS[key], None
    return None, None


def declared_blocks_for(model_cls: type) -> tuple[str, ...] | None:
    """Block class names declared for ``model_cls`` or its nearest declared base class.

    Walks the MRO, so subclasses (e.g. ``CameraWanModel(WanModel)``) inherit the declaration; at
    each class a ``"module.QualName"`` key wins over a bare ``__name__`` key. Returns ``()`` for a
    model listed in :data:`REGIONAL_UNSUPPORTED` (nothing can be compiled regionally), ``None``
    when the model is unknown (callers then auto-discover).
    """
    return _declaration(model_cls)[0]


def regional_unsupported_reason(model_cls: type) -> str | None:
    """Why regional compilation is refused for ``model_cls`` (see :data:`REGIONAL_UNSUPPORTED`), or None."""
    return _declaration(model_cls)[1]


# ---------------------------------------------------------------------------------------------
# Runtime check
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class SwapCheck:
    """Result of :func:`safe_to_swap`.

    ``safe``: paths that may be swapped (input order). ``refused``: ``{path: reason}``.
    ``variants``: ``{block class: number of distinct configurations}`` among the safe blocks: each
    variant is one more graph of the same ``forward`` on the first call (a recompile that is not a
    warm-up failure). ``warnings``: human-readable notes (e.g. more variants than the recompile limit).
    """

    safe: list[str]
    refused: dict[str, str]
    variants: dict[str, int]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        """True when nothing was refused."""
        return not self.refused

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable view."""
        return dataclasses.asdict(self)

    def as_text(self) -> str:
        """Short multi-line summary for a node's report."""
        lines = [f"{len(self.safe)} blocks safe to swap"
                 + (f" ({', '.join(f'{n} variants of {k}' for k, n in self.variants.items() if n > 1)})"
                    if any(n > 1 for n in self.variants.values()) else "")]
        lines += [f"refused {p}: {r}" for p, r in self.refused.items()]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


_CONTAINERS = (nn.ModuleList, nn.ModuleDict)


def _caller(root: nn.Module, path: str) -> tuple[str, nn.Module]:
    """The module whose forward calls the block at ``path``: the nearest ancestor that is not a
    plain ``ModuleList``/``ModuleDict`` (those are never called; their owner iterates them)."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        anc_path = ".".join(parts[:cut])
        anc = root.get_submodule(anc_path)
        if type(anc) not in _CONTAINERS:
            return anc_path, anc
    return "", root  # pragma: no cover - the loop always ends at root


@functools.lru_cache(maxsize=256)
def _source_of(module_name: str) -> str | None:
    mod = sys.modules.get(module_name)
    if mod is None:
        return None
    try:
        return inspect.getsource(mod)
    except (OSError, TypeError):
        return None


def _isinstance_hits(caller: nn.Module, block: nn.Module) -> list[str]:
    """``isinstance(..., Name)`` uses in the caller's source file naming a class of the block's MRO."""
    names = [k.__name__ for k in type(block).__mro__
             if not k.__module__.startswith(("torch.", "builtins"))]
    src = _source_of(type(caller).__module__)
    if not src or not names:
        return []
    hits = []
    alt = "|".join(re.escape(n) for n in names)
    pattern = re.compile(r"isinstance\(\s*[^,()]+,\s*(?:\([^)]*)?\b(?:[\w.]+\.)?(" + alt + r")\b")
    for lineno, line in enumerate(src.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("#"):
            continue
        m = pattern.search(line)
        if m:
            hits.append(f"{type(caller).__module__}:{lineno}: isinstance(..., {m.group(1)})")
    return hits


def _signature(block: nn.Module) -> tuple:
    """Structural signature: child module types and parameter shapes, plus bool/str/None/float
    attributes (ints are left out: ids like ``layer_id`` are often never read by forward)."""
    children = tuple((n, type(m).__name__) for n, m in block.named_modules())
    params = tuple((n, tuple(p.shape)) for n, p in block.named_parameters())
    attrs = []
    for mod_name, mod in block.named_modules():
        for k, v in vars(mod).items():
            if k.startswith("_") or k == "training":
                continue
            if isinstance(v, (bool, str, float)) or v is None:
                attrs.append((mod_name, k, v))
    return children, params, tuple(attrs)


def _refusal(root: nn.Module, path: str) -> str | None:
    """Why the block at ``path`` must not be swapped, or None. Raises ``ValueError`` for a bad path."""
    if not path:
        raise ValueError("empty block path: the root is compiled whole, not swapped")
    try:
        block = root.get_submodule(path)
    except AttributeError as e:
        raise ValueError(f"{type(root).__name__} has no submodule {path!r}: {e}") from e
    caller_path, caller = _caller(root, path)
    cname = type(caller).__name__
    if cname in NON_GENERIC_PARENTS:
        return f"called by {cname} ({caller_path or 'root'}): {NON_GENERIC_PARENTS[cname]}"
    hits = _isinstance_hits(caller, block)
    if hits:
        return f"caller {cname} ({caller_path or 'root'}) may dispatch on the block's class: " + "; ".join(hits[:3])
    return None


def safe_to_swap(root: nn.Module, paths: Sequence[str], *, recompile_limit: int | None = None) -> SwapCheck:
    """Check that each block at ``paths`` (dotted, relative to ``root``) can be swapped for a compiled wrapper.

    A block is refused when the module that calls it (nearest ancestor that is not a plain
    ``ModuleList``/``ModuleDict``) is a known non-generic caller (:data:`NON_GENERIC_PARENTS`, e.g.
    the UNet's ``TimestepEmbedSequential``), or when the source file defining that caller's class
    contains ``isinstance(x, C)`` for a class ``C`` in the block's MRO (heuristic; a file without
    available source is not scanned). Blocks of one class with different structure (child types,
    parameter shapes, bool/str/float attributes) are counted as variants; more variants than
    ``recompile_limit`` (default: :func:`core.torch_compat.recompile_limit`) gives a warning: Dynamo
    would run the surplus blocks eagerly. Int attributes are not compared, so an int that forward
    branches on (Wan VACE's ``block_id``) is not seen. Raises ``ValueError`` for an empty or unknown path.
    """
    safe: list[str] = []
    refused: dict[str, str] = {}
    sigs: dict[str, set] = {}
    for path in paths:
        reason = _refusal(root, path)
        if reason is not None:
            refused[path] = reason
            continue
        safe.append(path)
        block = root.get_submodule(path)
        sigs.setdefault(type(block).__name__, set()).add(_signature(block))
    variants = {k: len(v) for k, v in sigs.items()}
    limit = torch_compat.recompile_limit() if recompile_limit is None else recompile_limit
    warnings = [f"{n} structurally different {k} blocks > recompile_limit={limit}: Dynamo would run the "
                f"surplus ones eagerly" for k, n in variants.items() if n > limit]
    return SwapCheck(safe=safe, refused=refused, variants=variants, warnings=warnings)


# ---------------------------------------------------------------------------------------------
# Auto-discovery for models without a declaration
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Discovery:
    """Result of :func:`discover_blocks`.

    ``paths``: chosen blocks (module order). ``groups``: ``{class: [paths]}``. ``refused``:
    candidates that were not swappable (their insides were searched instead). ``dropped``:
    ``{class: parameter share}`` of repeated groups left out as too small.
    """

    paths: list[str]
    groups: dict[str, list[str]]
    refused: dict[str, str]
    dropped: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable view."""
        return dataclasses.asdict(self)


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@functools.lru_cache(maxsize=256)
def _forward_only_calls(cls: type) -> str | None:
    """``name`` when ``cls.forward`` is just ``return self.<name>(...)`` (docstring allowed), else None."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError):
        return None
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef):
        return None
    body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or not isinstance(body[0].value, ast.Call):
        return None
    func = body[0].value.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return func.attr
    return None


def discover_blocks(root: nn.Module, *, min_repeats: int = 2, min_param_share: float = 0.05) -> Discovery:
    """Choose repeated blocks of an undeclared model, at the level regional compilation needs.

    1. Candidates are children of ``nn.ModuleList``/``nn.ModuleDict`` containers (not containers
       themselves) whose class ``__name__`` occurs at least ``min_repeats`` times among all
       candidates of the model (counted model-wide: SD1.5 has one ``BasicTransformerBlock`` per list).
    2. In module order, the outermost candidates are kept unless :func:`safe_to_swap` refuses them;
       then their insides are searched instead (UNet: ``input_blocks.N`` -> ``BasicTransformerBlock``).
    3. A kept block that is a pure wrapper (one child that is not a container, no own parameters or
       buffers, and a ``forward`` that is only ``return self.<child>(...)``, e.g. HiDream's
       ``HiDreamImageBlock``) is replaced by its child when that child is swappable.
    4. Class groups holding less than ``min_param_share`` of the model's parameters are dropped
       (e.g. Chroma's 5-layer guidance approximator, HunyuanVideo's 2 token-refiner blocks).

    Unlike :func:`core.compile.find_repeated_blocks` (which is kept as it was), the result is meant to
    match the declared table (:data:`COMFY_REPEATED_BLOCKS`); tests compare them on ComfyUI's models.
    Raises ``ValueError`` for ``min_repeats < 1`` or ``min_param_share`` outside [0, 1].
    """
    if min_repeats < 1:
        raise ValueError(f"min_repeats must be >= 1, got {min_repeats}")
    if not 0.0 <= min_param_share <= 1.0:
        raise ValueError(f"min_param_share must be in [0, 1], got {min_param_share}")
    cands: list[tuple[str, nn.Module]] = []
    for path, mod in root.named_modules():
        if isinstance(mod, _CONTAINERS):
            for name, child in mod.named_children():
                if not isinstance(child, _CONTAINERS):
                    cands.append((f"{path}.{name}" if path else name, child))
    counts: dict[str, int] = {}
    for _, m in cands:
        counts[type(m).__name__] = counts.get(type(m).__name__, 0) + 1
    chosen: list[str] = []
    refused: dict[str, str] = {}
    for path, m in cands:
        if counts[type(m).__name__] < min_repeats or any(path.startswith(k + ".") for k in chosen):
            continue
        reason = _refusal(root, path)
        if reason is not None:
            refused[path] = reason
            continue
        chosen.append(path)
    unwrapped: list[str] = []
    for path in chosen:
        mod = root.get_submodule(path)
        while True:
            kids = list(mod.named_children())
            if (len(kids) != 1 or isinstance(kids[0][1], _CONTAINERS)
                    or any(True for _ in mod.parameters(recurse=False))
                    or any(True for _ in mod.buffers(recurse=False))
                    or _forward_only_calls(type(mod)) != kids[0][0]):
                break
            child_path = f"{path}.{kids[0][0]}"
            if _refusal(root, child_path) is not None:
                break
            path, mod = child_path, kids[0][1]
        unwrapped.append(path)
    groups: dict[str, list[str]] = {}
    for path in unwrapped:
        groups.setdefault(type(root.get_submodule(path)).__name__, []).append(path)
    total = _numel(root)
    dropped: dict[str, float] = {}
    if total > 0 and min_param_share > 0:
        for cls in list(groups):
            share = sum(_numel(root.get_submodule(p)) for p in groups[cls]) / total
            if share < min_param_share:
                dropped[cls] = round(share, 4)
                del groups[cls]
    order = {p: i for i, (p, _) in enumerate(root.named_modules())}
    paths = sorted((p for ps in groups.values() for p in ps), key=order.__getitem__)
    return Discovery(paths=paths, groups=groups, refused=refused, dropped=dropped)


# ---------------------------------------------------------------------------------------------
# One entry point for adapters
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class BlockChoice:
    """What :func:`choose_blocks` picked for a model.

    ``paths``: blocks to compile (only swappable ones). ``how``: "declared", "auto-discovered" or
    "unsupported" (``reason`` says why; ``paths`` is then empty). ``classes``: ``{class: count}``.
    ``check``: the :class:`SwapCheck` of the paths. ``discovery``: set when auto-discovered.
    """

    paths: list[str]
    how: str
    classes: dict[str, int]
    check: SwapCheck | None = None
    discovery: Discovery | None = None
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable view."""
        return dataclasses.asdict(self)

    def as_text(self) -> str:
        """One or more lines for a node report."""
        if self.how == "unsupported":
            return f"regional compile unsupported: {self.reason}"
        head = (f"{len(self.paths)} blocks ({self.how}): "
                + ", ".join(f"{n} x {k}" for k, n in self.classes.items()))
        extra = []
        if self.check is not None:
            extra += [f"  refused {p}: {r}" for p, r in self.check.refused.items()]
            extra += [f"  {n} structural variants of {k} (one graph each)"
                      for k, n in self.check.variants.items() if n > 1]
            extra += [f"  warning: {w}" for w in self.check.warnings]
        if self.discovery is not None and self.discovery.dropped:
            extra.append("  small repeated groups left eager: "
                         + ", ".join(f"{k} ({v:.1%} of params)" for k, v in self.discovery.dropped.items()))
        if self.reason:
            extra.append(f"  note: {self.reason}")
        return "\n".join([head, *extra])


def choose_blocks(root: nn.Module) -> BlockChoice:
    """The blocks to compile regionally in ``root`` (a diffusion model), with how they were chosen.

    Declared models (:func:`declared_blocks_for`) use the table; a declared model where none of the
    declared classes is found (e.g. a renamed class in a newer ComfyUI) falls back to
    :func:`discover_blocks` and says so in ``reason``; unknown models are auto-discovered; models in
    :data:`REGIONAL_UNSUPPORTED` get ``how="unsupported"`` and no paths. Every path is checked with
    :func:`safe_to_swap`; refused ones are left out (and listed in ``check.refused``).
    """
    from .compile import find_repeated_blocks  # local: compile does not import this module

    declared = declared_blocks_for(type(root))
    if declared == ():
        return BlockChoice(paths=[], how="unsupported", classes={},
                           reason=regional_unsupported_reason(type(root)) or "declared unsupported")
    discovery = None
    reason = None
    how = "declared"
    paths = find_repeated_blocks(root, declared) if declared else []
    if not paths:
        if declared:
            reason = f"declared classes {list(declared)} not found in {type(root).__name__}; auto-discovered instead"
        discovery = discover_blocks(root)
        paths, how = discovery.paths, "auto-discovered"
    check = safe_to_swap(root, paths)
    classes: dict[str, int] = {}
    for p in check.safe:
        k = type(root.get_submodule(p)).__name__
        classes[k] = classes.get(k, 0) + 1
    return BlockChoice(paths=check.safe, how=how, classes=classes, check=check, discovery=discovery, reason=reason)
