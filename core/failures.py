"""Which exceptions the pack must let through untouched: interrupts and out-of-memory errors.

ComfyUI acts on an exception's exact type: ``comfy.model_management.InterruptProcessingException`` (the user's
Cancel) ends the prompt as "interrupted", and ``comfy.model_management.is_oom`` (``torch.OutOfMemoryError``, or
an accelerator error saying "out of memory") unloads every model and shows the memory tip. Re-wrapping either
(e.g. as a load error) or recording an interrupt as a failure of the pack would break that. No ComfyUI imports:
ComfyUI's interrupt is recognised by its qualified name (a ``BaseException`` in ComfyUI 0.33, an ``Exception``
in 0.8.0).
"""

from __future__ import annotations

import torch

__all__ = ["COMFY_INTERRUPT", "is_interrupt", "is_oom", "passes_through"]

COMFY_INTERRUPT = "comfy.model_management.InterruptProcessingException"


def is_interrupt(e: BaseException) -> bool:
    """An interrupt: anything that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``,
    ``GeneratorExit``, ComfyUI 0.33's interrupt) or ComfyUI's ``InterruptProcessingException`` of any version.

    Args:
        e: the exception.
    Returns:
        True for an interrupt.
    """
    if not isinstance(e, Exception):
        return True
    return any(f"{c.__module__}.{c.__qualname__}" == COMFY_INTERRUPT for c in type(e).__mro__)


def is_oom(e: BaseException) -> bool:
    """Out of memory as ComfyUI's ``is_oom`` sees it: ``torch.OutOfMemoryError`` (CUDA/XPU/MPS allocators), or an
    error whose message says "out of memory" (torch's ``AcceleratorError``, older CUDA ``RuntimeError``).

    Args:
        e: the exception.
    Returns:
        True for an out-of-memory error.
    """
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


def passes_through(e: BaseException) -> bool:
    """Whether ``e`` must reach ComfyUI unchanged (not wrapped, not rewritten): :func:`is_interrupt` or
    :func:`is_oom`.

    Args:
        e: the exception.
    Returns:
        True when the caller must re-raise ``e`` itself.
    """
    return is_interrupt(e) or is_oom(e)
