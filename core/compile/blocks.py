"""Which blocks regional compilation compiles: the declared table, the swap-safety check, auto-discovery.

:func:`choose_blocks`, the one block finder, uses :data:`COMFY_REPEATED_BLOCKS` for ComfyUI's models (diffusers'
``_repeated_blocks`` idea, by class *name*: no ComfyUI imports), else class names or auto-discovery. Swapping a
compiled block in (:func:`core.compile.swap.swap_in`) is only correct when its parent calls it generically (an
``OptimizedModule`` fails ``isinstance``): every choice passes :func:`safe_to_swap`."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Sequence

from torch import nn

from .. import torch_compat
from .swap import submodule

_FLUX = ("DoubleStreamBlock", "SingleStreamBlock")
#: ``{model class: block classes}`` by ``__name__`` (``"module.QualName"`` where two share a name); outermost match
#: wins. Covers ComfyUI 0.8.0 and 0.33.0 (tests/comfy/test_architectures.py builds each at real size on both; those
#: new in 0.33.0 are skipped on 0.8.0). Comments: the parent's generic call in ``comfy/ldm/`` (0.8.0 rows as there,
#: still the same calls in 0.33.0; rows below "0.33.0" cite 0.33.0). Subclasses inherit their base's row (MRO):
#: 0.33.0's Anima (MiniTrainDIT), NextDiTPixelSpace (NextDiT), SCAILWanModel/SCAIL2WanModel/WanDancerModel (WanModel).
COMFY_REPEATED_BLOCKS: dict[str, tuple[str, ...]] = {
    "UNetModel": ("BasicTransformerBlock",),  # SD1/2/XL/SVD: attention.py SpatialTransformer `block(x, context=)`
    "Flux": _FLUX,  # Flux.1/2/Kontext: flux/model.py forward_orig `block(img=, txt=, vec=, pe=)`, `block(img, vec=)`
    "Chroma": _FLUX,  # chroma/model.py forward_orig: the same calls as Flux
    "ChromaRadiance": _FLUX,  # chroma_radiance/model.py: same loops; per-pixel NerfGLUBlocks left out on purpose
    "HunyuanVideo": _FLUX,  # hunyuan_video/model.py forward_orig `block(img=, txt=)`; 2 TokenRefiners left out
    "Hunyuan3Dv2": _FLUX,  # hunyuan3d/model.py Hunyuan3Dv2.forward: flux blocks, plain calls
    "comfy.ldm.modules.diffusionmodules.mmdit.MMDiT": ("JointBlock",),  # SD3: mmdit.py `self.joint_blocks[i](..)`
    "OpenAISignatureMMDITWrapper": ("JointBlock",),  # as SD3; pre_only last block, SD3.5 attn blocks: 2-3 graphs
    "comfy.ldm.aura.mmdit.MMDiT": ("MMDiTBlock", "DiTBlock"),  # AuraFlow: `layer(c, x, global_cond)`, `layer(cx, ..)`
    "WanModel": ("WanAttentionBlock",),  # wan/model.py forward_orig `block(x, e=e0, ...)`; 1st x strided
    "VaceWanModel": ("WanAttentionBlock",),  # VaceWanAttentionBlocks: int block_id, a graph each: left out
    "HumoWanModel": ("WanAttentionBlockAudio",),  # wan/model.py HumoWanModel.forward_orig `block(x, e=, audio=)`
    "LTXVModel": ("BasicTransformerBlock",),  # lightricks/model.py _process_transformer_blocks `block(x, context=)`
    "LTXAVModel": ("BasicAVTransformerBlock",),  # lightricks/av_model.py `block((vx, ax), v_context=, ...)`
    # Lumina 2/Z-Image: lumina/model.py `layer(x, mask, ...)`, refiners too (0.33.0: Z-Image Omni's siglip_refiner)
    "NextDiT": ("JointTransformerBlock",),
    "QwenImageTransformer2DModel": ("QwenImageTransformerBlock",),  # qwen_image/model.py `block(hidden_states=)`
    # hidream/model.py: HiDreamImageBlock wrappers `return self.block(...)`; MoE boolean masks break fullgraph
    "HiDreamImageTransformer2DModel": ("HiDreamImageTransformerBlock", "HiDreamImageSingleTransformerBlock"),
    "PixArtMS": ("PixArtMSBlock",),  # pixart/pixartms.py `block(x, y, t0, y_lens, (H, W), **kwargs)`
    "HunYuanDiT": ("HunYuanDiTBlock",),  # hydit/models.py `block(x, c, text_states, freqs_cis_img, skip)`
    "HunYuanDiTPlain": ("HunYuanDiTBlock",),  # hunyuan3dv2_1/hunyuandit.py `block(combined, ...)`; MoE: breaks
    "AsymmDiTJoint": ("AsymmetricJointBlock",),  # Mochi: genmo/joint_model/asymm_models_joint.py `block(x, c, ..)`
    "GeneralDIT": ("GeneralDITTransformerBlock",),  # cosmos/model.py `for _, block in self.blocks.items(): block(x)`
    "MiniTrainDIT": ("Block",),  # cosmos/predict2.py `block(x_B_T_H_W_D, t_embedding_B_T_D, ...)`
    "ACEStepTransformer2DModel": ("LinearTransformerBlock",),  # ace/model.py `block(hidden_states=, ...)`
    "AudioDiffusionTransformer": ("TransformerBlock",),  # audio/dit.py ContinuousTransformer `layer(x, ...)`
    "Kandinsky5": ("TransformerEncoderBlock", "TransformerDecoderBlock"),  # kandinsky5/model.py `block(...)`
    "OmniGen2Transformer2DModel": ("OmniGen2TransformerBlock",),  # omnigen/omnigen2.py `layer(hidden_states, ..)`
    # ---- 0.33.0 ----
    # ACE-Step 1.5: ace/ace_step15.py AceStepDiTModel.forward `layer(hidden_states=x, temb=, ...)` (the denoiser;
    # sliding/full attention: 2 variants) and, run on every call by prepare_condition, the encoder layers:
    # AceStepLyricEncoder/AceStepTimbreEncoder.forward `layer(hidden_states=, ...)`, AttentionPooler and
    # AudioTokenDetokenizer.forward `layer(x, (cos, sin))`
    "AceStepConditionGenerationModel": ("AceStepDiTLayer", "AceStepEncoderLayer"),
    # boogu/model.py BooguTransformer2DModel.forward `layer(text_hidden_states, ...)` (refiners),
    # `layer(combined_img_hidden_states, ...)` (double stream), `layer(hidden_states, None, rotary_emb, temb, ..)`
    "BooguTransformer2DModel": ("OmniGen2TransformerBlock", "BooguDoubleStreamBlock"),
    "CogVideoXTransformer3DModel": ("CogVideoXBlock",),  # cogvideo/model.py _forward `block(hidden_states=, ...)`
    "ErnieImageModel": ("ErnieImageSharedAdaLNBlock",),  # ernie/model.py forward `layer(hidden_states, rope, temb)`
    # hidream_o1/model.py _forward `layer(x=, attention_mask=, freqs_cis=, optimized_attention=, past_key_value=)`:
    # the language model's layers; the reference-image ViT (visual.blocks, output cached across steps) left out
    "HiDreamO1Transformer": ("TransformerBlock",),
    "Ideogram4Transformer2DModel": ("Ideogram4TransformerBlock",),  # ideogram4/model.py _backbone `layer(h, ...)`
    "JoyImageTransformer3DModel": ("JoyImageTransformerBlock",),  # joyimage/model.py _forward `block(img=, txt=..)`
    # Krea 2: krea2/model.py _forward `block(combined, tvec, ...)`; the small text-fusion blocks left out
    "SingleStreamDiT": ("SingleStreamBlock",),
    "LensTransformer2DModel": ("LensTransformerBlock",),  # lens/model.py _forward `block(hidden_states=, ...)`
    "MageFlowTransformer2DModel": ("QwenImageTransformerBlock",),  # mage_flow/model.py _forward `block(..)`
    "MiniMaxH3Model": ("DiTBlock",),  # minimax/model.py _forward `block(h, t_emb, ...)`; small RefinerBlocks left out
    # minimax_music/dit.py ContinuousTransformer.forward `layer(x, rotation_matrix)`
    "MiniMaxMusic3DiT": ("TransformerBlock",),
    # pixeldit/model.py PixDiT_T2I._forward `blk(s, y_emb, ...)`, `blk(x_pixels, s_cond, ...)` (PidNet: the same)
    "PixDiT_T2I": ("MMDiTBlockT2I", "PiTBlock"),
    "NaDiT": ("NaMMSRTransformerBlock",),  # SeedVR2: seedvr/model.py forward `block(vid=, txt=, ...)`; 5 variants
    # trellis2/model.py SLatFlowModel.forward `block(h, t_emb, cond, ...)` (sparse), SparseStructureFlowModel.forward
    "Trellis2": ("ModulatedSparseTransformerCrossBlock", "ModulatedTransformerCrossBlock"),
    # TripoSplat: triposplat/model.py _forward `block(h_x, mod=, rotary_emb=, ...)`: refiners and main blocks
    "LatentSeqMMFlowModel": ("UnifiedTransformerBlock",),
    # wan/ar_model.py forward_block `block(x, e=, ..., kv_cache=)`, else WanModel.forward_orig's call
    "CausalWanModel": ("CausalWanAttentionBlock",),
}
#: Callers that do not call (some of) their children generically: ``{caller class: reason}``. A block whose caller is
#: one of them is never swapped (an ``OptimizedModule`` fails their ``isinstance`` dispatch). Explicit, by class
#: ``__name__``; for ComfyUI's own callers the whole truth (:func:`swap_refusal`). tests/comfy/test_architectures.py
#: holds it to ComfyUI: ``test_swap_table_holds_on_comfyui`` swaps children of each row for wrappers and sees the
#: result change, and every declared block for one and sees it unchanged; the structure tests find no
#: :func:`isinstance_dispatch` in any declared block's caller on 60 architectures.
NON_GENERIC_PARENTS: dict[str, str] = {
    "UNetModel": "UNetModel._forward hands its blocks to forward_timestep_embed (iterates them, isinstance dispatch)",
    "TimestepEmbedSequential": "openaimodel.forward_timestep_embed dispatches on isinstance(layer, TimestepBlock/...)",
    "StageC": "cascade/stage_c.py _down_encode/_up_decode dispatch on isinstance(block, ResBlock/AttnBlock/...)",
    "StageB": "cascade/stage_b.py _down_encode/_up_decode dispatch on isinstance(block, ResBlock/AttnBlock/...)",
}
#: Models whose repeated blocks cannot be swapped: ``{model class: reason}``.
REGIONAL_UNSUPPORTED = {
    k: f"Stable Cascade: {NON_GENERIC_PARENTS[k]} (compile it whole)" for k in ("StageC", "StageB")
}
REGIONAL_UNSUPPORTED["WanAnimate2Model"] = (  # ComfyUI 0.33.0 wan/model_animate2.py
    "Wan Animate 2: forward_orig calls its blocks only through methods (block.forward_gen, block.forward_pose, "
    "block.kv_from_input), never block(...): a swapped compiled block would never run (compile it whole)"
)
_CONTAINERS = (nn.ModuleList, nn.ModuleDict)  # never called themselves; their owner iterates them
_source = functools.lru_cache(maxsize=256)(inspect.getsource)  # of another pack's caller module, scanned per block


def declaration(model_cls: type) -> tuple[tuple[str, ...] | None, str | None]:
    """``(block class names, None)`` declared for ``model_cls`` or its nearest declared base (MRO; per class a
    ``"module.QualName"`` key wins); ``((), reason)`` for :data:`REGIONAL_UNSUPPORTED`; ``(None, None)`` if unknown."""
    for klass in model_cls.__mro__:
        for key in (f"{klass.__module__}.{klass.__qualname__}", klass.__name__):
            if key in REGIONAL_UNSUPPORTED:
                return (), REGIONAL_UNSUPPORTED[key]
            if key in COMFY_REPEATED_BLOCKS:
                return COMFY_REPEATED_BLOCKS[key], None
    return None, None


@dataclasses.dataclass
class SwapCheck:
    """:func:`safe_to_swap`'s result. ``safe``: swappable paths (input order); ``refused``: ``{path: reason}``;
    ``variants``: ``{class: distinct structures}`` among the safe blocks (one graph each); ``warnings``: notes."""

    safe: list[str]
    refused: dict[str, str]
    variants: dict[str, int]
    warnings: list[str]


def isinstance_dispatch(caller: type, block: type) -> list[str]:
    """Lines of ``caller``'s module that test ``isinstance(x, C)`` for a class ``C`` of ``block``'s MRO (torch's and
    builtins' classes left out), as ``"module:line: isinstance(..., C)"``; ``[]`` when none or the source is
    unavailable. A conservative guard for model code no table covers (another node pack's); ComfyUI's own callers
    are judged by :data:`NON_GENERIC_PARENTS` alone (:func:`swap_refusal`).

    Args:
        caller: the class whose instance calls the block.
        block: the block's class.
    Returns:
        Up to every matching line, in file order (comment lines skipped).
    """
    names = [k.__name__ for k in block.__mro__ if not k.__module__.startswith(("torch.", "builtins"))]
    try:
        src = _source(sys.modules[caller.__module__]) if names else ""
    except (KeyError, OSError, TypeError):
        src = ""
    if not src:
        return []
    pattern = re.compile(
        r"isinstance\(\s*[^,()]+,\s*(?:\([^)]*)?\b(?:[\w.]+\.)?(" + "|".join(re.escape(n) for n in names) + r")\b"
    )
    return [
        f"{caller.__module__}:{n}: isinstance(..., {m.group(1)})"
        for n, line in enumerate(src.splitlines(), 1)
        if not line.lstrip().startswith("#") and (m := pattern.search(line))
    ]


def swap_refusal(root: nn.Module, path: str) -> str | None:
    """Why the block at ``path`` must not be swapped, or None.

    The caller is the block's nearest ancestor that is not a plain ``ModuleList``/``ModuleDict``. Refused: a caller
    of :data:`NON_GENERIC_PARENTS` (an explicit table, by class ``__name__``; ComfyUI's callers are judged by it
    alone, no source read: ``tests/comfy/test_architectures.py`` holds it to ComfyUI by running models with blocks
    swapped for wrappers); a caller from outside ComfyUI (``comfy.*``) whose module dispatches on the block's class
    (:func:`isinstance_dispatch`: another node pack's model, which no table can know).

    Args:
        root: the model (``nn.Module``).
        path: a submodule path in ``root`` (``"input_blocks.1.1"``).
    Returns:
        ``"called by <caller> (<its path>): <the row's reason>"``, ``"caller <caller> (<its path>) may dispatch on
        the block's class: <lines>"``, or ``None``.
    Raises:
        ValueError: an empty or unknown ``path``.
    """
    block, parts = submodule(root, path), path.split(".")
    cut = next(
        (c for c in range(len(parts) - 1, -1, -1) if type(root.get_submodule(".".join(parts[:c]))) not in _CONTAINERS),
        0,
    )
    caller_path, caller = ".".join(parts[:cut]), root.get_submodule(".".join(parts[:cut]))
    where = f"{type(caller).__name__} ({caller_path or 'root'})"
    if type(caller).__name__ in NON_GENERIC_PARENTS:
        return f"called by {where}: {NON_GENERIC_PARENTS[type(caller).__name__]}"
    if type(caller).__module__.split(".")[0] == "comfy":
        return None  # ComfyUI's own: the table is the whole truth
    hits = isinstance_dispatch(type(caller), type(block))
    return f"caller {where} may dispatch on the block's class: " + "; ".join(hits[:3]) if hits else None


def safe_to_swap(root: nn.Module, paths: Sequence[str], *, recompile_limit: int | None = None) -> SwapCheck:
    """Which blocks at ``paths`` may be swapped for compiled wrappers: not those :func:`swap_refusal` refuses (a caller
    in :data:`NON_GENERIC_PARENTS`, or another pack's caller dispatching on the block's class). Same-class blocks of
    different structure (ints not compared) are variants; more than ``recompile_limit`` (default: Dynamo's) warns.
    ``ValueError``: an empty or unknown path."""
    refused = {p: r for p in paths if (r := swap_refusal(root, p)) is not None}
    safe = [p for p in paths if p not in refused]
    sigs: dict[str, set] = {}
    for block in map(root.get_submodule, safe):  # structure: child types, parameter shapes, attributes that are
        mods = list(block.named_modules())  # bool/str/float/None (not ints: ids like ``layer_id`` are rarely read)
        params = tuple((n, tuple(p.shape)) for n, p in block.named_parameters())
        attrs = tuple(
            (n, k, v)
            for n, m in mods
            for k, v in vars(m).items()
            if not k.startswith("_") and k != "training" and (isinstance(v, (bool, str, float)) or v is None)
        )
        sigs.setdefault(type(block).__name__, set()).add(
            (tuple((n, type(m).__name__) for n, m in mods), params, attrs)
        )
    variants = {k: len(v) for k, v in sigs.items()}
    limit = torch_compat.recompile_limit() if recompile_limit is None else recompile_limit
    warnings = [
        f"{n} structurally different {k} blocks > recompile_limit={limit}: Dynamo would run the surplus ones eagerly"
        for k, n in variants.items()
        if n > limit
    ]
    return SwapCheck(safe=safe, refused=refused, variants=variants, warnings=warnings)


@dataclasses.dataclass
class Discovery:
    """How blocks were auto-discovered: ``paths`` (module order), ``groups`` ``{class: [paths]}``, ``refused``
    candidates (insides searched), ``dropped`` ``{class: parameter share}``."""

    paths: list[str]
    groups: dict[str, list[str]]
    refused: dict[str, str]
    dropped: dict[str, float]


@functools.lru_cache(maxsize=256)
def _forward_only_calls(cls: type) -> str | None:
    """``name`` when ``cls.forward`` is just ``return self.<name>(...)`` (docstring allowed), else None."""
    try:
        fn = ast.parse(textwrap.dedent(inspect.getsource(cls.forward))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    body = [s for s in getattr(fn, "body", []) if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    ret = body[0] if isinstance(fn, ast.FunctionDef) and len(body) == 1 else None
    func = getattr(ret.value, "func", None) if isinstance(ret, ast.Return) else None  # only ast.Call has .func
    ok = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
    return func.attr if ok else None


def _discover(root: nn.Module, min_repeats: int, min_param_share: float) -> Discovery:
    """Repeated blocks of an undeclared model, at the level the table would pick: 1. candidates are children of
    ``ModuleList``/``ModuleDict``s whose class occurs ``min_repeats`` times model-wide; 2. the outermost are kept,
    refused ones (:func:`swap_refusal`) searched inside; 3. a pure wrapper (one non-container child, no own
    parameters/buffers, ``forward`` only ``return self.<child>(...)``: HiDream's ``HiDreamImageBlock``) gives way
    to its child; 4. class groups under ``min_param_share`` of the parameters are dropped (Chroma's approximator)."""
    cands = [
        (f"{path}.{name}" if path else name, child)
        for path, mod in root.named_modules()
        if isinstance(mod, _CONTAINERS)
        for name, child in mod.named_children()
        if not isinstance(child, _CONTAINERS)
    ]
    counts = Counter(type(m).__name__ for _, m in cands)
    chosen: list[str] = []
    refused: dict[str, str] = {}
    for path, m in cands:
        if counts[type(m).__name__] >= min_repeats and not any(path.startswith(k + ".") for k in chosen):
            if (reason := swap_refusal(root, path)) is not None:
                refused[path] = reason
            else:
                chosen.append(path)
    groups: dict[str, list[str]] = {}
    for path in chosen:
        mod = root.get_submodule(path)
        while (
            (kids := list(mod.named_children()))
            and len(kids) == 1
            and not isinstance(kids[0][1], _CONTAINERS)
            and not [*mod.parameters(recurse=False), *mod.buffers(recurse=False)]
            and _forward_only_calls(type(mod)) == kids[0][0]
            and swap_refusal(root, f"{path}.{kids[0][0]}") is None
        ):
            path, mod = f"{path}.{kids[0][0]}", kids[0][1]
        groups.setdefault(type(mod).__name__, []).append(path)
    total = sum(p.numel() for p in root.parameters())
    shares = (
        {c: sum(t.numel() for p in ps for t in root.get_submodule(p).parameters()) / total for c, ps in groups.items()}
        if total > 0 and min_param_share > 0
        else {}
    )
    dropped = {c: round(share, 4) for c, share in shares.items() if share < min_param_share}
    groups = {c: ps for c, ps in groups.items() if c not in dropped}
    order = {p: i for i, (p, _) in enumerate(root.named_modules())}
    paths = sorted((p for ps in groups.values() for p in ps), key=order.__getitem__)
    return Discovery(paths=paths, groups=groups, refused=refused, dropped=dropped)


@dataclasses.dataclass
class BlockChoice:
    """What :func:`choose_blocks` picked. ``paths``: swappable blocks (module order); ``how``: "declared", "named",
    "auto-discovered" or "unsupported" (``reason`` says why, no paths); ``classes``: ``{class: count}``;
    ``check``: :class:`SwapCheck` of the candidates; ``discovery``: set when auto-discovered."""

    paths: list[str]
    how: str
    classes: dict[str, int]
    check: SwapCheck | None = None
    discovery: Discovery | None = None
    reason: str | None = None

    def as_text(self) -> str:
        """One or more lines for a node report."""
        if self.how == "unsupported":
            return f"regional compile unsupported: {self.reason}"
        lines = [f"{len(self.paths)} blocks ({self.how}): " + ", ".join(f"{n} x {k}" for k, n in self.classes.items())]
        if self.check is not None:
            lines += [f"  refused {p}: {r}" for p, r in self.check.refused.items()]
            lines += [
                f"  {n} structural variants of {k} (one graph each)" for k, n in self.check.variants.items() if n > 1
            ]
            lines += [f"  warning: {w}" for w in self.check.warnings]
        if self.discovery is not None and self.discovery.dropped:
            lines.append(
                "  small repeated groups left eager: "
                + ", ".join(f"{k} ({v:.1%} of params)" for k, v in self.discovery.dropped.items())
            )
        return "\n".join(lines + ([f"  note: {self.reason}"] if self.reason else []))


def choose_blocks(
    root: nn.Module,
    *,
    classes: Sequence[str] | None = None,
    discover: bool = False,
    min_repeats: int = 2,
    min_param_share: float = 0.05,
) -> BlockChoice:
    """The blocks of ``root`` (a diffusion model) to compile regionally: by default :func:`declaration`'s (outermost
    matches); a declared model where none is found (renamed in a newer ComfyUI) or an unknown one is auto-discovered;
    a :data:`REGIONAL_UNSUPPORTED` one gets ``how="unsupported"``. ``classes`` (e.g. diffusers' ``_repeated_blocks``)
    replaces the table, without fallback; ``discover=True`` ignores it. Paths :func:`safe_to_swap` refuses are left
    out. ``ValueError``: ``classes`` with ``discover``, ``min_repeats < 1``, ``min_param_share`` not in [0, 1]."""
    if (classes is not None and discover) or min_repeats < 1 or not 0.0 <= min_param_share <= 1.0:
        raise ValueError(
            f"choose_blocks: classes or discover=True, not both (got {classes!r}, {discover}); "
            f"min_repeats >= 1 (got {min_repeats}); min_param_share in [0, 1] (got {min_param_share})"
        )
    declared, unsupported = (None, None) if (classes is not None or discover) else declaration(type(root))
    if declared == ():
        return BlockChoice(paths=[], how="unsupported", classes={}, reason=unsupported)
    how, wanted, paths = ("named", set(classes), []) if classes is not None else ("declared", set(declared or ()), [])
    for path, mod in root.named_modules():  # outermost matches, module order, never the root
        if path and type(mod).__name__ in wanted and not any(path.startswith(k + ".") for k in paths):
            paths.append(path)
    discovery, reason = None, None
    if not paths and classes is not None:
        reason = f"none of the classes {list(classes)} found in {type(root).__name__}"
    elif not paths:
        if declared:
            reason = f"declared classes {list(declared)} not found in {type(root).__name__}; auto-discovered instead"
        discovery = _discover(root, min_repeats, min_param_share)
        paths, how = discovery.paths, "auto-discovered"
    check = safe_to_swap(root, paths)
    counts = dict(Counter(type(root.get_submodule(p)).__name__ for p in check.safe))
    return BlockChoice(paths=check.safe, how=how, classes=counts, check=check, discovery=discovery, reason=reason)


def repeated_block_paths(model: nn.Module) -> list[str]:
    """The blocks of a diffusers model to compile regionally: the dotted paths of the modules diffusers'
    ``compile_repeated_blocks`` compiles, i.e. every submodule whose class name is in ``model._repeated_blocks``
    (nested matches included, exactly as diffusers does; :func:`choose_blocks` with ``classes`` keeps only the
    outermost). ``[]`` when the attribute is missing or empty (SD3, VAEs).

    Args:
        model: a diffusers model (``ModelMixin``), e.g. a pipeline's ``unet`` or ``transformer``.
    Returns:
        paths in ``model.named_modules()`` order, never the root.
    """
    names = getattr(model, "_repeated_blocks", None) or ()
    if isinstance(names, str):
        names = (names,)
    wanted = set(names)
    return [p for p, m in model.named_modules() if p and type(m).__name__ in wanted]
