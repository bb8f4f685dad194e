"""Inference optimizations whose numerical effect is measured, not assumed.

* :mod:`.qkv` - zero-copy fused Q/K/V projections (diffusers' ``fuse_qkv_projections`` idea).
* :mod:`.layout` - channels_last conv weights, in place and reversible.
* :mod:`.attention` - pinned / probed PyTorch SDPA backends.
* :mod:`.quantize` - torchao dynamic quantization (int8 / float8) of Linear layers, on copies.
* :mod:`.plan` - the one plan type of both optimize paths (MODEL and pipeline): options, ordered steps, step reports.

Import the submodules (``from steadfast.core.optimize import qkv``); this package re-exports nothing.
How each one changes output bits is measured by the tests named in ``docs/measurements.md``; all of
them belong in the output fingerprint.
"""
