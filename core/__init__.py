"""Steadfast core: determinism, optimizations, hashing/comparison and compile-state tracking.

This package imports nothing from ComfyUI, so it can be used (and tested) from plain Python with
torch alone. The ComfyUI adapters live in ``nodes/``.
"""
