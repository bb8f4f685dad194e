"""Inference optimizations whose numerical effect is measured, not assumed.

* :mod:`.qkv` - zero-copy fused Q/K/V projections (diffusers' ``fuse_qkv_projections`` idea).
* :mod:`.layout` - channels_last conv weights, in place and reversible.
* :mod:`.attention` - pinned / probed PyTorch SDPA backends and a ComfyUI-compatible attention function.
* :mod:`.parity` - byte-level parity reports between a baseline and an optimized computation.

On CPU (measured): QKV fusion is bit-equal in fp32 but not in bf16 at large widths; channels_last and
the SDPA backend choice change output bits. All of them belong in the output fingerprint.
"""
from .attention import (
    SDPA_BACKENDS,
    UnsupportedBackendError,
    available_sdpa_backends,
    check_sdpa_backend,
    clear_sdpa_backend_cache,
    sdpa_attention,
    sdpa_context,
)
from .layout import as_channels_last, is_channels_last, to_channels_last_, to_contiguous_
from .parity import ParityReport, ParityStructureError, compare_outputs, measure_parity
from .qkv import (
    FusedQKV,
    FusionStats,
    NotFusableError,
    find_fusable_attention,
    fuse_all_qkv_,
    fuse_qkv_,
    fused_project,
    is_fused,
    qkv_stats,
    release_stale_fusions_,
    unfuse_all_qkv_,
    unfuse_qkv_,
)

__all__ = [
    "SDPA_BACKENDS",
    "UnsupportedBackendError",
    "available_sdpa_backends",
    "check_sdpa_backend",
    "clear_sdpa_backend_cache",
    "sdpa_attention",
    "sdpa_context",
    "as_channels_last",
    "is_channels_last",
    "to_channels_last_",
    "to_contiguous_",
    "ParityReport",
    "ParityStructureError",
    "compare_outputs",
    "measure_parity",
    "FusedQKV",
    "FusionStats",
    "NotFusableError",
    "find_fusable_attention",
    "fuse_all_qkv_",
    "fuse_qkv_",
    "fused_project",
    "is_fused",
    "qkv_stats",
    "release_stale_fusions_",
    "unfuse_all_qkv_",
    "unfuse_qkv_",
]
