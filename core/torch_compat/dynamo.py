"""Dynamo: its config (recompile limit, int specialisation, compile-only patches), counters, cache entries and errors.

Part of :mod:`core.torch_compat` (its face re-exports every public name); no ComfyUI imports."""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
import json
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .base import TorchAPIMissing, _api

#: Names of the settings as messages to users should spell them.
RECOMPILE_LIMIT_SETTING = "torch._dynamo.config.recompile_limit"


def recompile_limit() -> int:
    """Dynamo's per-code-object compile limit (``recompile_limit``; ``cache_size_limit`` before torch 2.7).

    Past it Dynamo runs the frame eagerly (or fails with ``fullgraph``). Raises :class:`TorchAPIMissing`
    when neither setting exists. Imports ``torch._dynamo``.
    """
    cfg = _api("torch._dynamo", "config", "reading the recompile limit")
    for name in ("recompile_limit", "cache_size_limit"):
        value = getattr(cfg, name, None)
        if isinstance(value, int):
            return value
    raise TorchAPIMissing(f"torch {torch.__version__}: {RECOMPILE_LIMIT_SETTING} (or cache_size_limit) is missing")


def specialize_int() -> contextlib.AbstractContextManager[Any]:
    """Context manager: ``torch._dynamo.config.specialize_int = True`` inside, the previous value after.

    torch's own ``config.patch`` (restores on exceptions too; nests). Python ints traced inside become
    constants with ordinary guards instead of symbolic sizes. Process-global while active.
    """
    cfg = _api("torch._dynamo", "config", "CompileOptions.specialize_ints")
    return cfg.patch(specialize_int=True)


_COMPILE_ONLY: contextvars.ContextVar[tuple[Callable[[], Any], ...]] = contextvars.ContextVar(
    "steadfast_compile_only", default=()
)


_compile_only_stacks: list[contextlib.ExitStack | None] = []  # one per open compile (Dynamo compiles one at a time)


_compile_only_lock = threading.Lock()


_compile_only_handler: list[Any] = []  # [torch._dynamo.callback_handler] once looked up, [None] when torch has none


def _compile_only_start(_args: Any) -> None:
    contexts = _COMPILE_ONLY.get()
    stack = contextlib.ExitStack() if contexts else None
    if stack is not None:
        for context in contexts:
            stack.enter_context(context())
    _compile_only_stacks.append(stack)


def _compile_only_end(_args: Any) -> None:
    stack = _compile_only_stacks.pop() if _compile_only_stacks else None
    if stack is not None:
        stack.close()


def _hook_compile_only() -> bool:
    """Register the compile start/end callbacks unless they are (again: ``torch._dynamo.reset()`` clears them);
    False when torch has no callback handler."""
    if not _compile_only_handler:
        handler = getattr(importlib.import_module("torch._dynamo"), "callback_handler", None)
        names = ("register_start_callback", "register_end_callback", "start_callbacks", "end_callbacks")
        _compile_only_handler.append(handler if all(hasattr(handler, n) for n in names) else None)
    handler = _compile_only_handler[0]
    if handler is None:
        return False
    if _compile_only_start not in handler.start_callbacks:
        with _compile_only_lock:
            if _compile_only_start not in handler.start_callbacks:
                _compile_only_stacks.clear()  # a reset dropped the callbacks: no compile of ours is open
                handler.register_start_callback(_compile_only_start)
                handler.register_end_callback(_compile_only_end)
    return True


@contextlib.contextmanager
def while_compiling(contexts: Sequence[Callable[[], contextlib.AbstractContextManager[Any]]]) -> Iterator[None]:
    """Context manager: the config patches made by ``contexts`` (factories, e.g. :func:`specialize_int`,
    :func:`trusted_cpu_isa`) hold only while Dynamo compiles a frame entered inside the block, not on a call that
    compiles nothing.

    Why: every config write marks torch's config hash dirty (``ConfigModule.get_hash``), so patches entered on every
    block call made each model call's :func:`compile_config_digest` recompute the whole config (docs/benchmarks.md
    section 19). The patches reach the compile through Dynamo's compile start/end callbacks
    (``torch._dynamo.callback_handler``, run around the outermost frame compile, Dynamo's trace and the backend's
    compile included; Dynamo compiles one frame at a time), which read the block's contexts from a context variable:
    a compile the pack did not start inside such a block is left alone. Where torch has no such callbacks the
    contexts hold for the whole block (the same compile; the hash is recomputed).

    Args:
        contexts: zero-argument callables returning context managers.
    """
    if not contexts:
        yield
        return
    if not _hook_compile_only():
        with contextlib.ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context())
            yield
        return
    token = _COMPILE_ONLY.set(tuple(contexts))
    try:
        yield
    finally:
        _COMPILE_ONLY.reset(token)


#: What ``torch.compile``'s first call imports (Dynamo, AOTAutograd, inductor's lowering and code generation).
COMPILE_STACK_MODULES = ("torch._dynamo", "torch._inductor.compile_fx")


def import_compile_stack() -> float:
    """Import :data:`COMPILE_STACK_MODULES` now; returns the seconds it took (about 0 when already imported).

    ``torch.compile`` imports them on its first call (cost: docs/benchmarks.md section 13), paid by the first
    prompt that compiles unless something imported them earlier. Raises
    :class:`TorchAPIMissing` when a module is gone.
    """
    import time

    t0 = time.perf_counter()
    for module in COMPILE_STACK_MODULES:
        if module not in sys.modules:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise TorchAPIMissing(
                    f"preloading the compile stack needs {module}, which torch {torch.__version__} does not have ({e})"
                ) from e
    return time.perf_counter() - t0


def dynamo_counters() -> dict[str, int]:
    """Flat copy of the Dynamo counters the compile registry attributes (monotonic until cleared).

    Keys: ``unique_graphs``, ``calls_captured``, ``fxgraph_cache_hit`` / ``_miss``, ``autograd_cache_hit`` /
    ``_miss`` and ``graph_break:<reason>`` per graph-break reason; values are counts.
    """
    counters = _api("torch._dynamo.utils", "counters", "counting compiled graphs")
    snap = {
        "unique_graphs": counters["stats"]["unique_graphs"],
        "calls_captured": counters["stats"]["calls_captured"],
        "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
        "autograd_cache_hit": counters["aot_autograd"]["autograd_cache_hit"],
        "autograd_cache_miss": counters["aot_autograd"]["autograd_cache_miss"],
    }
    for reason, n in counters["graph_break"].items():
        snap[f"graph_break:{reason}"] = n
    return snap


def compile_activity() -> int:
    """A number that grows whenever Dynamo converts a frame or inductor looks up its FX-graph cache: the moments
    inductor and Triton write their cache files (``torch._dynamo.utils.counters``: ``frames.total`` plus the
    ``fxgraph_cache_hit/miss/bypass`` counts). 0 before ``torch._dynamo`` is loaded (nothing compiled yet); cheap
    (dictionary reads), so the compile cache reads it around every model call."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    counters = _api("torch._dynamo.utils", "counters", "noticing compiles (compile cache records)")
    inductor = counters["inductor"]
    return (
        counters["frames"]["total"]
        + inductor["fxgraph_cache_hit"]
        + inductor["fxgraph_cache_miss"]
        + inductor["fxgraph_cache_bypass"]
    )


def dynamo_global_state() -> dict[str, Any]:
    """The global state Dynamo's ``GLOBAL_STATE`` guard checks, as a dict (``GlobalStateGuard().__getstate__()``).

    Keys include ``autocast_state`` (``{"enabled": [bool per device], ...}``), ``torch_function`` and
    ``torch_function_all_disabled``. Cheap (a C call); does not import ``torch._dynamo``.
    """
    guard = _api("torch._C._dynamo.guards", "GlobalStateGuard", "explaining GLOBAL_STATE recompiles")
    return dict(json.loads(guard().__getstate__()))


def cache_entry_count(code: Any) -> int:
    """Number of Dynamo cache entries (compiled variants) on the code object ``code``.

    Dynamo stops compiling ``code`` once this reaches :func:`recompile_limit`. Uses the debug API
    ``torch._dynamo.eval_frame._debug_get_cache_entry_list``. Raises ``TypeError`` when ``code`` is not a code
    object and :class:`TorchAPIMissing` when the API is gone.
    """
    if not inspect.iscode(code):
        raise TypeError(f"cache_entry_count needs a code object, got {type(code).__name__}")
    entries = _api("torch._dynamo.eval_frame", "_debug_get_cache_entry_list", "counting Dynamo cache entries")
    return len(entries(code))


def cache_entry_guards(code: Any) -> list[Any]:
    """The guard trees (``GuardManagerWrapper``, ``.check(f_locals)``) of the Dynamo cache entries on ``code``, newest
    first: what the jit evaluates before each call of a compiled frame (benchmarks compare the pack's own checks with
    it). Raises ``TypeError`` when ``code`` is not a code object and :class:`TorchAPIMissing` when the API is gone."""
    if not inspect.iscode(code):
        raise TypeError(f"cache_entry_guards needs a code object, got {type(code).__name__}")
    entries = _api("torch._dynamo.eval_frame", "_debug_get_cache_entry_list", "reading Dynamo's guards")
    return [m for m in (getattr(e, "guard_manager", None) for e in entries(code)) if m is not None]


def supports_guard_filter_fn() -> bool:
    """Whether ``torch.compile(options={"guard_filter_fn": fn})`` is understood by this torch.

    Feature test: Dynamo's ``_optimize`` (``optimize`` in older torch) takes a ``guard_filter_fn`` argument
    (torch >= 2.8; present in 2.13/2.14). Raises :class:`TorchAPIMissing` when neither function exists.
    """
    eval_frame = _api("torch._dynamo", "eval_frame", "guard filters")
    target = getattr(eval_frame, "_optimize", None) or getattr(eval_frame, "optimize", None)
    if target is None:
        raise TorchAPIMissing(f"torch {torch.__version__}: torch._dynamo.eval_frame has no _optimize/optimize")
    return "guard_filter_fn" in inspect.signature(target).parameters


def is_compile_error(exc: BaseException) -> bool:
    """True for errors raised by torch.compile itself: Dynamo tracing, a backend compiler, inductor's code
    generation or C++ build (any exception class defined under ``torch._dynamo`` or ``torch._inductor``)."""
    exc_mod = _api("torch._dynamo", "exc", "recognising compile errors")
    if isinstance(exc, (exc_mod.TorchDynamoException, exc_mod.FailOnRecompileLimitHit)):
        return True
    return type(exc).__module__.startswith(("torch._dynamo", "torch._inductor"))


def is_graph_break(error: BaseException) -> bool:
    """True for Dynamo's ``Unsupported`` (what a graph break raises under ``fullgraph=True``).

    Args:
        error: any exception.
    Returns:
        whether it is (a subclass of) ``torch._dynamo.exc.Unsupported``; False when torch has no such class.
    """
    exc_mod = getattr(getattr(torch, "_dynamo", None), "exc", None)
    unsupported = getattr(exc_mod, "Unsupported", None)
    return unsupported is not None and isinstance(error, unsupported)
