"""The shared ground of :mod:`core.torch_compat`: the error it raises, the on-demand import of one private API, and a
patch shared by overlapping blocks.

Part of :mod:`core.torch_compat` (its face re-exports every public name); no ComfyUI imports."""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch


class TorchAPIMissing(RuntimeError):
    """A private torch API Steadfast relies on does not exist in this torch build (moved or renamed)."""


def _api(module: str, attr: str, purpose: str) -> Any:
    """``module.attr``, imported on demand. Raises :class:`TorchAPIMissing` (naming ``purpose``) when absent."""
    try:
        value = getattr(sys.modules.get(module) or importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise TorchAPIMissing(
            f"{purpose} needs {module}.{attr}, which torch {torch.__version__} does not have "
            f"({type(e).__name__}: {e}); Steadfast is checked against torch 2.13/2.14"
        ) from e
    return value


class _SharedPatch:
    """One patch of torch shared by overlapping blocks in any thread: the first entry applies it, the last exit undoes
    it (blocks may nest and overlap; a patch that did not apply is not undone)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._undo: Callable[[], None] | None = None

    @contextlib.contextmanager
    def hold(self, apply: Callable[[], Callable[[], None] | None]) -> Iterator[bool]:
        """Inside the block the patch holds; ``apply`` (called by the first entry) patches and returns the function
        that undoes it, or None when it did not patch. Yields whether the patch holds."""
        with self._lock:
            if self._depth == 0:
                self._undo = apply()
            self._depth += 1
            patched = self._undo is not None
        try:
            yield patched
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._undo is not None:
                    self._undo()
                    self._undo = None
