"""Ahead-of-time compiled blocks (``torch.compiler`` AOT compile): support, guards that serialise, traced modules.

Part of :mod:`core.torch_compat` (its face re-exports every public name); no ComfyUI imports."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .. import switches
from .base import TorchAPIMissing, _api


def checked_once(fn: Any) -> Any:
    """``fn`` (a loaded ``torch.compiler.load_compiled_function`` result) with its own guard check on each call
    turned off (``AOTCompiledFunction.disable_guard_check``), for a caller that runs ``fn.guard_check`` itself before
    every call and calls ``fn`` only when it passed: otherwise every call evaluates the same guards twice
    (docs/benchmarks.md section 19). Returns ``fn``. Raises :class:`TorchAPIMissing` when the method is gone."""
    disable = getattr(fn, "disable_guard_check", None)
    if disable is None or not hasattr(fn, "guard_check"):
        raise TorchAPIMissing(
            f"precompiled blocks need AOTCompiledFunction.guard_check and disable_guard_check, "
            f"which torch {torch.__version__} does not have"
        )
    disable()
    return fn


#: Set to 0 by an operator to turn precompiled blocks off (1 turns them on where torch's default is off).
PRECOMPILED_ENV = switches.PRECOMPILED.name


def aot_compile_support() -> tuple[bool, str]:
    """Whether this torch can save and load a compiled function (``torch.compile(fn).aot_compile(...)``,
    ``save_compiled_function``, ``torch.compiler.load_compiled_function``, the setting
    ``torch._dynamo.config.enable_aot_compile``).

    Returns:
        ``(on, reason)``: on when the APIs exist (torch 2.11 and 2.14; 2.11's default for the setting is off,
        the pack turns it on while saving: :func:`aot_compile_enabled`) unless ``$STEADFAST_PRECOMPILED`` is 0;
        ``reason`` says which.
    """
    switch = switches.PRECOMPILED.text().lower()
    if switch in ("0", "false", "no", "off"):
        return False, f"off (${PRECOMPILED_ENV}={switch})"
    if not hasattr(torch.compiler, "load_compiled_function"):
        return False, f"torch {torch.version.__version__} has no torch.compiler.load_compiled_function"
    try:
        cfg = _api("torch._dynamo", "config", "precompiled blocks (aot_compile)")
    except TorchAPIMissing as e:
        return False, str(e)
    current = getattr(cfg, "enable_aot_compile", None)
    if current is None:
        return False, f"torch {torch.version.__version__} has no torch._dynamo.config.enable_aot_compile"
    if switch in ("1", "true", "yes", "on"):
        return True, f"on (${PRECOMPILED_ENV}={switch})"
    return True, "on (torch's default)" if current else (
        f"on (torch {torch.version.__version__}: enable_aot_compile turned on while saving)"
    )


def aot_compile_enabled() -> contextlib.AbstractContextManager[Any]:
    """Context manager: ``torch._dynamo.config.enable_aot_compile = True`` inside (torch's ``config.patch``), so that
    ``torch.compile(fn)`` made inside offers ``.aot_compile``. Raises :class:`TorchAPIMissing` without the setting."""
    cfg = _api("torch._dynamo", "config", "precompiled blocks (aot_compile)")
    if not hasattr(cfg, "enable_aot_compile"):
        raise TorchAPIMissing(
            f"precompiled blocks need torch._dynamo.config.enable_aot_compile, which torch "
            f"{torch.version.__version__} does not have"
        )
    return cfg.patch(enable_aot_compile=True)


def guard_serialisable(entry: Any) -> bool:
    """Whether an aot_compile artifact can keep the Dynamo guard ``entry`` (a ``GuardFilterEntry``) and still load.

    False for global guards, the types in ``torch._dynamo.guards.CheckFunctionManager.
    UNSUPPORTED_SERIALIZATION_GUARD_TYPES``, guards naming ``__closure__``, ``__mro__`` or ``type(`` (the function
    holding the cell is not saved: load fails with ``'_Missing'``), and TYPE_MATCH/BUILTIN_MATCH guards on a nested
    class (ComfyUI's ``operations`` layers: not importable by name); docs/benchmarks.md section 13. Raises
    :class:`TorchAPIMissing` when the guard manager class is gone.
    """
    manager = _api("torch._dynamo.guards", "CheckFunctionManager", "precompiled blocks (serialisable guards)")
    unsupported = getattr(manager, "UNSUPPORTED_SERIALIZATION_GUARD_TYPES", ())
    if getattr(entry, "is_global", False) or getattr(entry, "guard_type", None) in unsupported:
        return False
    name = getattr(entry, "name", "")
    if "__closure__" in name or "__mro__" in name or "type(" in name:
        return False
    if getattr(entry, "guard_type", None) in ("TYPE_MATCH", "BUILTIN_MATCH") and getattr(entry, "has_value", False):
        t = type(entry.value)
        return t.__qualname__ == t.__name__
    return True


@contextlib.contextmanager
def portable_guard_state() -> Iterator[None]:
    """Context manager for saving an ``aot_compile`` artifact: interned immutable values (small ints, floats,
    strings, bools, None, ``torch.dtype``, ``torch.device``) are pickled as themselves in the guard state.

    torch's ``torch._dynamo.guards.GuardsStatePickler`` replaces, by object id, every value of the traced frame
    that no kept guard reached (``missing_values``) with ``_Missing``. With a guard filter that drops the per-step
    entries of ComfyUI's ``transformer_options`` (``original_shape`` = ``[2, 4, 16, 16]``...), the small ints
    there share their id with every other 2, 4 or 16 of the guard state (tensor sizes among them), and so does a
    module attribute holding ``torch.float32`` with every float32 tensor's dtype: the artifact then fails to load
    (``empty_strided(): argument 'dtype' must be torch.dtype, not _Missing``; docs/benchmarks.md section 21).
    Inside the block, ``GuardsStatePickler.reducer_override`` pickles those types normally (their value is the
    same object everywhere); everything else is unchanged. The class attribute is put back in ``finally``;
    process-wide while active. Raises :class:`TorchAPIMissing` when the pickler class or method is gone.
    """
    pickler = _api("torch._dynamo.guards", "GuardsStatePickler", "precompiled blocks (guard state pickling)")
    original = pickler.__dict__.get("reducer_override")
    if original is None:
        raise TorchAPIMissing(
            f"torch {torch.version.__version__}: torch._dynamo.guards.GuardsStatePickler has no "
            "reducer_override (precompiled blocks)"
        )
    immutable = (int, float, bool, str, type(None), torch.dtype, torch.device)

    def reducer_override(self: Any, obj: Any) -> Any:
        if type(obj) in immutable and id(obj) in getattr(self, "missing_values", ()):
            return NotImplemented  # pickle's own reduction: the value itself
        return original(self, obj)

    pickler.reducer_override = reducer_override
    try:
        yield
    finally:
        pickler.reducer_override = original


def traced_modules(aot: Any) -> set[str]:
    """The names of the Python modules whose code Dynamo traced (inlined) into an ``aot_compile`` result.

    Reads the artifact's ``SourceInfo`` (``AOTCompiledFunction.source_info``: a property on torch 2.11, a method on
    2.14; ``_artifacts.source_info`` on both), whose ``inlined_sources`` Dynamo fills from the code objects it traced
    (``graph_capture_output.traced_code``). Raises :class:`TorchAPIMissing` when neither is there.
    """
    info = getattr(getattr(aot, "_artifacts", None), "source_info", None)
    if info is None:
        info = getattr(aot, "source_info", None)
        info = info() if callable(info) else info
    sources = getattr(info, "inlined_sources", None)
    if sources is None:
        raise TorchAPIMissing(
            f"precompiled blocks need the traced sources of an aot_compile result "
            f"(AOTCompiledFunction.source_info.inlined_sources), which torch "
            f"{torch.version.__version__} does not have"
        )
    return {str(s.module) for s in sources}


def duplicate_source(entry: Any) -> str | None:
    """The other source of a Dynamo ``DUPLICATE_INPUT`` guard entry (``G['F']`` is the same object as
    ``G['torch'].nn.functional``): the name of ``source_b`` in the guard's ``create_fn`` partial, or None when it is
    not there."""
    source = guard_arguments(entry).get("source_b")
    if source is None:
        return None
    name = source.name() if callable(getattr(source, "name", None)) else getattr(source, "name", None)
    return name if isinstance(name, str) else None


def guard_arguments(entry: Any) -> dict[str, Any]:
    """The keyword arguments a Dynamo guard entry was made with (``orig_guard.create_fn``, a ``functools.partial``
    of a ``GuardBuilder`` method: ``DICT_CONTAINS`` has ``key`` and ``invert``, ``DUPLICATE_INPUT`` ``source_b``);
    empty when there are none."""
    fn = getattr(getattr(entry, "orig_guard", None), "create_fn", None)
    return dict(getattr(fn, "keywords", None) or {})


def artifact_guard_manager(fn: Any) -> Any | None:
    """The C++ guard tree of a loaded ``aot_compile`` artifact (``AOTCompiledFunction._artifacts.guard_manager``, a
    ``GuardManagerWrapper``), for a caller that evaluates it with the frame's locals it already has: torch's own
    ``guard_check`` binds the call to the function's ``inspect.Signature`` on every call first, which costs more than
    the tree itself (docs/benchmarks.md section 22).

    Returns:
        the manager (``.check(f_locals) -> bool``, ``.check_verbose(f_locals)`` naming the failed guard), or None
        when the artifact has none or its function has closure cells (their values are part of torch's locals: use
        ``guard_check`` then).
    """
    artifacts = getattr(fn, "_artifacts", None)
    manager = getattr(artifacts, "guard_manager", None)
    env = getattr(artifacts, "runtime_env", None)
    if manager is None or not callable(getattr(manager, "check", None)) or getattr(env, "closure", None):
        return None
    if not callable(getattr(manager, "check_verbose", None)):
        return None
    return manager


def guard_failure(manager: Any, f_locals: dict[str, Any]) -> str:
    """Which guard of an artifact's tree fails for ``f_locals`` (torch's ``check_verbose``: the failed guards'
    code, without the source line and file torch appends), as one line of at most 300 characters; ``"?"`` when torch
    does not say."""
    try:
        result = manager.check_verbose(f_locals)
    except Exception as e:  # noqa: BLE001 (a reason, never an error)
        return f"check_verbose raised {type(e).__name__}"
    parts = getattr(result, "verbose_code_parts", None) or []
    # each part is the guard's code, then "# <source line> # <file>:<line> in <function>": the guard alone
    text = "; ".join(str(p).split(" # ")[0].strip() for p in parts) if parts else str(result)
    return " ".join(text.split())[:300] or "?"
