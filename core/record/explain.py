"""Explain a hash mismatch: every recorded field that differs between two run records.

A run record (Seeded Sampler's ``run_record`` output, JSON) holds the sampler settings, the seeds, the model
identity and the environment fingerprint. :func:`explain` flattens both records to dotted field names
(``fingerprint.num_threads``) and lists each difference as ``field: reference -> now``, classed as

- ``changes bits``: known to change output bits (measured; see ``docs/measurements.md`` and the tests named
  there): thread count, torch/CUDA/cuDNN version, GPU, CPU vector ISA, attention backend, compile
  mode/backend/inductor preset, determinism and TF32 flags, dtype (precision), QKV fusion, channels-last, quantization,
  model digest (base weights, patches), sampler settings, seeds, latent shape, batch-invariance policy, the ComfyUI
  version, Dynamic VRAM, ``--fast-disk``, CUDA graphs, the Comfy Compiler, attention fallbacks,
  ComfyUI's ``--fast`` options, fp16 accumulation, ComfyUI's dtype/attention switches, comfy-kitchen's version
  (``core/record/environment.py``), the cuBLAS / cuBLASLt workspace variables, ComfyUI's multi-GPU CFG split;
- ``may change bits``: not measured either way (Python/numpy/pack version, comfy-aimdo version, platform ...).

Fields that differ on every run without touching the bits (timings, counters, the output hashes themselves)
are not listed. When nothing recorded differs, :meth:`Explanation.as_text` says so plainly: the cause is then
outside what the record captures. Two upstream sources of run-to-run differences change bits with every recorded
setting equal; when a record shows one in use (:func:`upstream_sources`) the explanation names it: a LoRA on fp8
weights under Dynamic VRAM (ComfyUI issue 15365) and ComfyUI's multi-GPU CFG split. This module imports nothing
from ComfyUI.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "EXPLAIN_LABELS",
    "FieldDiff",
    "Explanation",
    "flatten",
    "explain",
    "parse_record",
    "expected_difference",
    "upstream_sources",
    "UPSTREAM_LORA_FP8_DYNAMIC_VRAM",
    "UPSTREAM_MULTIGPU_CFG_SPLIT",
]

#: CPU code-path setting (dotted, under ``fingerprint.cpu_settings``: the keys of
#: :func:`core.determinism.portable.cpu_settings`) -> what :func:`explain` says about it.
EXPLAIN_LABELS: dict[str, str] = {
    "portable": "portable CPU mode on/off (pinned code paths vs this CPU's fastest)",
    "aten_capability": "ATen vector kernels (ATEN_CPU_CAPABILITY): softmax, SDPA, elementwise, randn",
    "mkldnn_enabled": "oneDNN on/off: convolution and GELU kernels",
    "mkl_cbwr": "MKL numerical-reproducibility branch (MKL_CBWR): linear, bmm, SDPA, exp",
    "threads": "CPU reductions split by thread count",
    "mkl_max_threads": "MKL threads: GEMM split by thread count",
    "inductor_simdlen": "inductor's vector width for compiled CPU code",
    "env": "a CPU-settings environment variable (read at start-up)",
    "cpu_flags": "the CPU's vector ISA (which kernels run when nothing is pinned)",
}

# Leaf patterns (regex on the dotted name) that differ run to run without changing the bits.
_VOLATILE = re.compile(
    r"(^|\.)([a-z_]*sha256|hash|created|timestamp|time|seconds|[a-z_]*_seconds"
    r"|first_call_seconds|compile_seconds|run_log|last_run|calls|calls_this_run(\..*)?|activations"
    r"|cache_state(\..*)?|recompiles_this_run|recompile_reasons_this_run|params_replaced_this_run"
    r"|live_after_run|flags_measured|record_created|status|warnings|messages)$"
)

# Dotted-name patterns known to change bits (searched anywhere in the name), with the reason shown.
_KNOWN: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), why)
    for p, why in (
        (r"(^|\.)num_threads$", "CPU reductions split by thread count"),
        (r"(^|\.)num_interop_threads$", "thread pools"),
        (r"(^|\.)(torch|cuda|cudnn)$", "kernels differ between versions"),
        (r"(^|\.)(gpu|gpu_capability|cpu_capability|device)$", "another device runs other kernels"),
        (r"(^|\.)attention$", "attention backend"),
        (
            r"(^|\.)compile(\.(mode|backend|dynamic|fullgraph|blocks|options.*))?$",
            "compiled code is not bit-equal to eager",
        ),
        (r"(tf32|float32_matmul_precision|fp32_precision)", "TF32 / fp32 matmul precision (speed vs bits)"),
        (r"(^|\.)(flags|determinism)(\..*)?$", "determinism / precision flags"),
        (r"(^|\.)(dtype|precision)$", "numeric precision (compute dtype)"),
        (r"(^|\.)compile\.inductor_preset$", "inductor config preset changes generated code"),
        (r"(^|\.)(qkv_fusion|channels_last)(\..*)?$", "optimization changes the kernels"),
        (r"(^|\.)quantize(\..*)?$", "quantized weights and activations (expected to differ)"),
        (
            r"(^|\.)model(\.(digest|file|file_size|tensors|bytes|base_digest|digest_kind))?$",
            "a different model (weights or patches)",
        ),
        (r"(^|\.)model\.(patches_digest|patched_keys)$", "other weight patches (LoRA, strength)"),
        (r"(^|\.)(seeds|seed|batch_seed_mode|per_step_noise)(\[.*\])?$", "another noise"),
        (r"(^|\.)(sampler|scheduler|steps|cfg|denoise)$", "sampler settings"),
        (r"(^|\.)(latent_shape|output_shape)$", "another size or batch"),
        (r"(^|\.)batch_invariant(\..*)?$", "batch-invariance policy (free memory / batch composition)"),
        (
            r"(^|\.)comfyui$",
            "ComfyUI's own code changed (e.g. 0.33.0 draws fp16/bf16 noise in float32; docs/compatibility.md)",
        ),
        (
            r"(^|\.)dynamic_vram$",
            "Dynamic VRAM (comfy-aimdo) loads weights another way; upstream reports leaks between runs",
        ),
        (
            r"(^|\.)comfy_fast$",
            "ComfyUI --fast options change kernels (fp16 accumulation, fp8 matmul, cuBLAS ops, autotune)",
        ),
        (r"(^|\.)fp16_accumulation$", "fp16 accumulation in matmuls (speed vs bits)"),
        (r"(^|\.)comfy_numeric_args(\..*)?$", "ComfyUI dtype / attention switches"),
        (r"(^|\.)comfy_kitchen$", "comfy-kitchen supplies ComfyUI's kernels"),
        (
            r"(^|\.)fast_disk$",
            "ComfyUI --fast-disk (disk-backed weight loading; reported to change outputs, ComfyUI issue 15528)",
        ),
        (r"(^|\.)cuda_graphs$", "ComfyUI CUDA graphs (--disable-cuda-graphs): captured kernels under Dynamic VRAM"),
        (r"(^|\.)comfy_compiler$", "the Comfy Compiler (memory compiler + CUDA graphs; --disable-comfy-compiler)"),
        (r"(^|\.)attention_fallbacks(\[.*\])?$", "a pinned attention backend fell back to torch's own choice"),
        (
            r"(^|\.)(cublas_workspace_config|cublaslt_workspace_size)$",
            "cuBLAS / cuBLASLt workspace: decides whether a GPU matmul may split its reduction (split-K)",
        ),
        (
            r"(^|\.)multigpu_cfg_split(\[.*\])?$",
            "ComfyUI's multi-GPU CFG split: cond and uncond evaluated on different devices",
        ),
    )
)

#: Known upstream sources of run-to-run differences, named by :func:`upstream_sources` when a record shows them in use.
UPSTREAM_LORA_FP8_DYNAMIC_VRAM = (
    "a LoRA on fp8 weights under Dynamic VRAM (comfy-aimdo): ComfyUI issue 15365 reports runs of the same workflow "
    "that differ by 5-7/255, only while the LoRA is loaded; start ComfyUI with --disable-dynamic-vram for run-to-run "
    "equality"
)
UPSTREAM_MULTIGPU_CFG_SPLIT = (
    "ComfyUI's multi-GPU CFG split (MultiGPU CFG Split): cond and uncond are evaluated on different devices, so each "
    "half's bits depend on which GPU (and which kernels) it lands on, and its load balancing by relative speed can "
    "move work between devices from run to run; sample on one device for run-to-run equality"
)
# The CPU code-path settings (fingerprint.cpu_settings.*, core/determinism/portable.py), each with its own label.
_KNOWN = (
    tuple((re.compile(rf"(^|\.)cpu_settings\.{name}(\..*)?$"), why) for name, why in EXPLAIN_LABELS.items()) + _KNOWN
)


@dataclasses.dataclass(frozen=True)
class FieldDiff:
    """One differing field: ``field`` (dotted), ``reference`` and ``now`` (JSON text; ``<absent>`` when
    missing), ``known`` (True = known to change bits) and ``why`` (short reason, "" when not known)."""

    field: str
    reference: str
    now: str
    known: bool
    why: str

    def as_text(self) -> str:
        tag = f"changes bits: {self.why}" if self.known else "may change bits"
        return f"{self.field}: {self.reference} -> {self.now}  [{tag}]"


@dataclasses.dataclass(frozen=True)
class Explanation:
    """All differences between a reference record and the current one (known-to-change-bits first), and the known
    upstream sources of run-to-run differences either record shows in use (:func:`upstream_sources`)."""

    diffs: tuple[FieldDiff, ...]
    upstream: tuple[str, ...] = ()

    @property
    def identical(self) -> bool:
        """True when no recorded field (other than run-to-run volatile ones) differs."""
        return not self.diffs

    def as_text(self) -> str:
        upstream = [
            "known upstream source of run-to-run differences in use: " + u for u in self.upstream
        ]  # named whether or not a recorded field differs: they change bits with every setting equal
        if not self.diffs:
            head = (
                "nothing recorded differs between the reference run and this run: the cause is outside the "
                "run record (e.g. other custom nodes, inputs not recorded, hardware faults)"
            )
            return "\n".join([head, *upstream])
        known = [d for d in self.diffs if d.known]
        head = f"{len(self.diffs)} recorded field(s) differ ({len(known)} known to change bits):"
        return "\n".join([head, *("  " + d.as_text() for d in self.diffs), *upstream])

    def as_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "diffs": [dataclasses.asdict(d) for d in self.diffs],
            "upstream": list(self.upstream),
        }


def parse_record(record: Mapping[str, Any] | str) -> dict[str, Any]:
    """A run record as a dict. Accepts the dict or its JSON text. Raises ValueError for text that is not a
    JSON object (the message names what was given)."""
    if isinstance(record, Mapping):
        return dict(record)
    try:
        value = json.loads(record)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"run record is not JSON ({type(e).__name__}: {str(e)[:80]}); got {str(record)[:60]!r}"
        ) from e
    if not isinstance(value, dict):
        raise ValueError(f"run record must be a JSON object, got {type(value).__name__}")
    return value


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": 1, "c": [1, 2]}`` (lists stay whole: seeds compare as one)."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)[:200]


def upstream_sources(record: Mapping[str, Any]) -> list[str]:
    """The known upstream sources of run-to-run differences that a run record shows in use.

    - :data:`UPSTREAM_LORA_FP8_DYNAMIC_VRAM`: ``fingerprint.dynamic_vram`` true, fp8 weights (``fingerprint.dtype``
      names a float8 dtype) and a weight patch (``model.patched_keys`` > 0: a LoRA);
    - :data:`UPSTREAM_MULTIGPU_CFG_SPLIT`: ``fingerprint.multigpu_cfg_split`` lists the extra devices (recorded by
      Seeded Sampler when the model carries ComfyUI's multi-GPU clones).

    Args:
        record: a run record (dict).
    Returns:
        the sentences, in that order (empty when none applies or the fields are absent).
    """
    fp = record.get("fingerprint") if isinstance(record.get("fingerprint"), Mapping) else {}
    model = record.get("model") if isinstance(record.get("model"), Mapping) else {}
    out = []
    patched = model.get("patched_keys")
    if fp.get("dynamic_vram") and "float8" in str(fp.get("dtype", "")) and isinstance(patched, int) and patched > 0:
        out.append(UPSTREAM_LORA_FP8_DYNAMIC_VRAM)
    if fp.get("multigpu_cfg_split"):
        out.append(UPSTREAM_MULTIGPU_CFG_SPLIT)
    return out


def explain(reference: Mapping[str, Any] | str, now: Mapping[str, Any] | str) -> Explanation:
    """Every recorded field that differs between ``reference`` and ``now`` (dicts or JSON text), and the known
    upstream sources of run-to-run differences either shows in use (:func:`upstream_sources`).

    Raises ValueError when either is not a JSON object."""
    ref_rec, cur_rec = parse_record(reference), parse_record(now)
    upstream = tuple(dict.fromkeys(upstream_sources(ref_rec) + upstream_sources(cur_rec)))
    ref, cur = flatten(ref_rec), flatten(cur_rec)
    diffs: list[FieldDiff] = []
    for name in sorted(set(ref) | set(cur)):
        if _VOLATILE.search(name):
            continue
        a, b = ref.get(name, "<absent>"), cur.get(name, "<absent>")
        if a == b:
            continue
        why = next((w for pattern, w in _KNOWN if pattern.search(name)), "")
        diffs.append(
            FieldDiff(name, a if a == "<absent>" else _text(a), b if b == "<absent>" else _text(b), bool(why), why)
        )
    diffs.sort(key=lambda d: (not d.known, d.field))
    return Explanation(tuple(diffs), upstream)


def expected_difference(
    record_a: Mapping[str, Any] | str | None, record_b: Mapping[str, Any] | str | None
) -> tuple[bool, str]:
    """``(expected, text)`` for two outputs whose bytes differ, from the run records that made them.

    Expected when the records differ in a field known to change bits (named in ``text``: the first field of
    each reason, at most six reasons, so one setting's many fields cannot hide another setting); not
    expected when a record is missing (nothing to tell by) or when they agree on every such field (a broken
    promise). Raises ValueError when a record is not a JSON object (:func:`parse_record`).
    """
    if not record_a or not record_b:
        return False, "DIFFERENT (link both run records to tell a difference by design from a failure)"
    known = [d for d in explain(record_a, record_b).diffs if d.known]
    if not known:
        return False, "DIFFERENT although no recorded setting known to change bits differs: a broken promise"
    seen: set[str] = set()
    first = [d for d in known if not (d.why in seen or seen.add(d.why))]  # first field per reason, in order
    return True, "different, as expected: " + "; ".join(f"{d.field} ({d.why})" for d in first[:6])
