"""The compile use case, for both paths: a model's blocks compiled with :class:`~.options.CompileOptions`, tracked in
the registry, with the persistent compile cache picked by name; then each model call run through it.

:func:`compile_use` is the one entry: the MODEL path (``nodes/patches/compile.py``, swapped-in blocks) and the pipeline
path (``core/pipelines/optimize.py``, diffusers' in-place ``compile_repeated_blocks``) both call it, and both run their
calls through :meth:`Compiled.run` (the cache active, the call tracked, a corrupt cached file moved aside and the call
retried once). The host (ComfyUI) says where caches live through a :class:`CacheChoice`; nothing here reads it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from .. import torch_compat
from .guards import GuardFilterFn
from .options import CompileOptions
from .record import CompileRecord
from .registry import REGISTRY, RecompileError
from .warm import artifact as compile_artifact
from .warm import cache as compile_cache
from .warm import cache_location

__all__ = ["CacheChoice", "Compiled", "compile_use", "open_compile_cache"]

log = logging.getLogger("steadfast")
T = TypeVar("T")


@dataclass(frozen=True)
class CacheChoice:
    """Which persistent compile cache a compile uses, and where the host keeps them.

    Attributes:
        name: the workflow's cache name (node input): ``""`` = ``default``, ``off`` = none (inductor's own
            temporary folder); :func:`core.compile.warm.cache_location.check_name` decides.
        root: the operator's folder of caches (``$STEADFAST_COMPILE_CACHE`` or the host's user folder); None = the
            operator switched caches off.
        source: where ``root`` came from, for the report (``"$STEADFAST_COMPILE_CACHE"``, ...).
        device: the device whose code is cached (part of the cache's key).
        forbidden: folders HTTP clients can write: a cache may not overlap them
            (:class:`~.cache_location.CacheRefused`).
    """

    name: str = ""
    root: Path | None = None
    source: str = ""
    device: torch.device | str | None = None
    forbidden: tuple[str, ...] = ()


def open_compile_cache(
    backend: str,
    choice: CacheChoice | None,
    inductor_options: dict | None = None,
) -> tuple[compile_cache.CompileCache | None, str]:
    """The persistent compile cache for ``backend`` and a line for the node report (never an absolute path).

    Args:
        backend: the ``torch.compile`` backend; only inductor writes a cache.
        choice: the cache asked for, or None (the caller offers no persistent cache).
        inductor_options: a preset's inductor config: part of the cache directory's key
            (:func:`core.compile.warm.cache.cache_key_fields`).
    Returns:
        ``(cache, line)``; ``cache`` None when no persistent cache applies (the line says why).
    Raises:
        core.compile.warm.cache_location.CacheRefused: a name that is a path, or a root/name overlapping a folder HTTP
            clients can write.
    """
    if choice is None:
        return None, "compile cache: none offered here; inductor's default directory applies"
    chosen = cache_location.check_name(choice.name)  # CacheRefused for a path, before anything else
    if backend != "inductor":
        return None, f"compile cache: not used by backend {backend}"
    if chosen is None:
        return None, "compile cache: off (node input); inductor's default directory applies"
    if choice.root is None:
        return None, f"compile cache: off ({choice.source}); inductor's default directory applies"
    cache = compile_cache.open_cache(
        choice.root,
        chosen,
        device=choice.device,
        inductor_options=inductor_options,
        source=choice.source,
        forbidden=choice.forbidden,
    )
    if cache is None:
        return None, (
            f"compile cache {chosen!r} is not usable (see the server log); inductor's default directory applies"
        )
    line = f"compile cache: {chosen!r} ({choice.source})"
    if (note := compile_artifact.cache_note(chosen)) is not None:
        line += f"; {note}"
    if cache.messages:
        line += "\n  " + "\n  ".join(cache.messages)
    return cache, line


@dataclass
class Compiled:
    """A model compiled through :func:`compile_use`: its registry record and its compile cache.

    Attributes:
        record: the registry's :class:`~.record.CompileRecord` (compiled callables or, in place, the block paths;
            stats, recompiles with reasons, the precompiled route).
        created: False when the record was reused (this model compiled these blocks with equal options before).
        cache: the persistent compile cache active around each call, or None (inductor's default directory).
        lines: the report lines of the cache (and of the precompiled route when it is on).
    """

    record: CompileRecord
    created: bool
    cache: compile_cache.CompileCache | None
    lines: list[str] = field(default_factory=list)

    def run(
        self,
        call: Callable[[], T],
        *,
        shape: Any = None,
        strict: bool | None = None,
        around: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
        eager: Callable[[], T] | None = None,
    ) -> T:
        """One call of the compiled model: ``call()`` with the cache active, tracked by the registry (compiles,
        recompiles with reasons), inside ``around()`` (the MODEL path swaps its compiled blocks in there) and, with
        the precompiled route, one flags reading per call and the queued saves flushed after it.

        Args:
            call: the model call.
            shape: the input's shape, for the record (``stats.shapes_seen``).
            strict: a recompile in a warm call raises :class:`~.registry.RecompileError` (None: the record's
                setting).
            around: a context manager factory entered inside the tracked call.
            eager: how to answer uncompiled. Given, a compile error (not under ``fullgraph``) disables the record
                with the reason, logs a warning, and the call runs ``eager()``; None, it propagates.
        Returns:
            what ``call()`` returned (or ``eager()`` after a compile error).
        Raises:
            RecompileError: under ``strict``. Anything ``call`` raises that is not a compile error handled above; a
            compile error on a corrupt cached file is retried once with the cache moved aside
            (:func:`core.compile.warm.cache.run_cached`).
        """
        record, cache = self.record, self.cache

        def tracked() -> T:
            scope = record.precompiled.call_scope() if record.precompiled is not None else contextlib.nullcontext()
            with REGISTRY.track(record, shape=shape, strict=strict), around(), scope:
                out = call()
            if record.precompiled is not None:  # precompiled artifacts for new keys, outside the tracked call
                record.precompiled.flush()
            return out

        n_messages = len(cache.messages) if cache is not None else 0
        try:
            return compile_cache.run_cached(cache, tracked, retry_if=torch_compat.is_compile_error)
        except RecompileError:
            raise
        except Exception as e:
            if eager is None or not torch_compat.is_compile_error(e) or record.options.get("fullgraph"):
                raise  # fullgraph: a graph break is an error
            REGISTRY.disable(record, f"{type(e).__name__}: {cache.redact(str(e)) if cache is not None else e}")
            log.warning("Steadfast: compile failed for %s, running it EAGER from now on: %s", record.label, e)
            return eager()
        finally:
            if cache is not None and len(cache.messages) != n_messages:  # the cache was moved aside: say so
                REGISTRY.note_compile_cache(record, cache.as_dict(), cache.messages[n_messages:])


def compile_use(
    model: torch.nn.Module,
    options: CompileOptions,
    blocks: Sequence[str],
    *,
    label: str,
    cache: CacheChoice | None,
    guard_filter_fn: GuardFilterFn | None = None,
    strict: bool = False,
    in_place: bool = False,
) -> Compiled:
    """Compile ``blocks`` of ``model`` (lazily: Dynamo compiles at the first call) and open the compile cache.

    Args:
        model: the module whose blocks compile (ComfyUI's ``BaseModel``; a diffusers denoiser).
        options: the ``torch.compile`` settings, held whole.
        blocks: the submodule paths to compile (``["diffusion_model"]`` for a full compile); in place, for reports.
        label: the record's name in reports.
        cache: the persistent compile cache asked for (None: none offered, inductor's default directory).
        guard_filter_fn: Dynamo guard filter for the compiled blocks (:func:`~.guards.comfy_guard_filter`).
        strict: a recompile after warm-up fails the call (:meth:`Compiled.run`).
        in_place: the model compiled itself (diffusers' ``compile_repeated_blocks``): nothing is swapped in, and
            the precompiled route does not apply.
    Returns:
        the :class:`Compiled` handle: the record (reused when this ``model`` compiled these ``blocks`` with equal
        options before), the cache and its report lines.
    Raises:
        ValueError: unknown block paths.
        core.compile.warm.cache_location.CacheRefused: a cache name that is a path, or a root overlapping client
        folders.
    """
    record, created = REGISTRY.get_or_create(
        model, options, blocks, label=label, guard_filter_fn=guard_filter_fn, strict=strict, in_place=in_place
    )
    opened, line = open_compile_cache(options.backend, cache, dict(options.options or {}))
    lines = [line]
    if opened is not None:  # with what opening it said (a cache moved aside at open: foreign, or an artifact changed)
        REGISTRY.note_compile_cache(record, opened.as_dict(), opened.messages)
        if record.precompiled is not None:
            pre = record.precompiled
            lines.append(
                f"  precompiled blocks: {_on_off(pre.enabled, pre.reason)} (loaded from and "
                "saved to this cache; any difference from what a block was precompiled for runs the jit, "
                "with the reason in the compile state)"
            )
    return Compiled(record, created, opened, lines)


def _on_off(enabled: bool, reason: str) -> str:
    """``reason`` said once with the state first: the support check's reasons mostly start with it ("on (torch's
    default)", "off ($STEADFAST_PRECOMPILED=0)"); issue 46 saw "on, on (...)" in Optimize's report."""
    word = "on" if enabled else "off"
    return reason if reason.startswith(word) else f"{word}: {reason}"
