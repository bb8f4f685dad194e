"""Every private torch API Steadfast uses (``torch._dynamo``, ``torch._inductor``, ``torch._logging``, ``torch._C``),
in one place.

No other module of ``core/`` or ``nodes/`` names ``torch._`` (``tests/core/test_torch_compat.py`` greps for it),
so a torch upgrade that moves one of these APIs breaks here, with a :class:`TorchAPIMissing` that names the API,
the torch version and what needs it, instead of deep inside a node. Every API is feature-detected when it is
first used (no version checks); none is imported at module import time (``torch._dynamo`` and
``torch._inductor`` take seconds to import and this module must stay cheap to import).

Checked against torch 2.13 and 2.14. Config changes use torch's own ``config.patch`` context managers; the only
global change this module makes on request is the recompile log tap (:func:`install_recompile_log_tap` /
:func:`remove_recompile_log_tap`). This module imports nothing from ComfyUI.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import inspect
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

__all__ = [
    "TorchAPIMissing", "RECOMPILE_LIMIT_SETTING", "INDUCTOR_DETERMINISTIC_SETTING", "RECOMPILES_LOGGER",
    "CONVERT_FRAME_LOGGER", "recompile_limit", "specialize_int", "dynamo_counters", "dynamo_global_state",
    "cache_entry_count", "supports_guard_filter_fn", "inductor_mode_options", "is_compile_error",
    "clear_inductor_caches", "has_fp32_precision_api", "get_fp32_precision", "set_fp32_precision",
    "inductor_deterministic", "set_inductor_deterministic", "RecompileLogTap", "install_recompile_log_tap",
    "remove_recompile_log_tap", "compile_events", "COMPILE_PHASES", "compile_activity", "PROBE_CPU_ISA_ENV",
    "trusted_cpu_isa", "while_compiling", "fast_isa_probe_child", "COMPILE_STACK_MODULES", "import_compile_stack",
    "tensor_version", "orig_module", "has_compiled_call", "compiled_call", "set_compiled_call",
    "PRECOMPILED_ENV", "aot_compile_support", "aot_compile_enabled", "guard_serialisable", "portable_guard_state",
    "built_kernel_loads", "checked_once", "pick_cpu_isa", "traced_modules", "compile_config_digest",
    "module_hook_dicts", "MACHINE_CONFIG_KEYS", "duplicate_source", "guard_arguments", "operator_name",
]

#: Names of the settings as messages to users should spell them.
RECOMPILE_LIMIT_SETTING = "torch._dynamo.config.recompile_limit"
INDUCTOR_DETERMINISTIC_SETTING = "torch._inductor.config.deterministic"
#: Dynamo's loggers the recompile log tap listens on.
RECOMPILES_LOGGER = "torch._dynamo.guards.__recompiles"
CONVERT_FRAME_LOGGER = "torch._dynamo.convert_frame"
_INDUCTOR_CONFIG = "torch._inductor.config"


class TorchAPIMissing(RuntimeError):
    """A private torch API Steadfast relies on does not exist in this torch build (moved or renamed)."""


def _api(module: str, attr: str, purpose: str) -> Any:
    """``module.attr``, imported on demand. Raises :class:`TorchAPIMissing` (naming ``purpose``) when absent."""
    try:
        value = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise TorchAPIMissing(f"{purpose} needs {module}.{attr}, which torch {torch.__version__} does not have "
                              f"({type(e).__name__}: {e}); Steadfast is checked against torch 2.13/2.14") from e
    return value


# ---------------------------------------------------------------------------------------------- Dynamo
#: The compile phases :func:`compile_events` reports to ``on_phase`` as each starts, in the order one frame's compile
#: starts them: Dynamo's trace of the frame, the backend (AOT autograd), inductor's lowering, its code generation,
#: the C++ build of the generated code (once per file), Dynamo's guards. They are names of torch's compile-time
#: events (``dynamo_timed``, logged through ``torch._dynamo.utils.get_chromium_event_logger()``, torch 2.11 and
#: 2.14); a phase that does not run (another backend, an inductor cache hit) is not reported.
COMPILE_PHASES = ("entire_frame_compile", "backend_compile", "GraphLowering.run", "Scheduler.codegen",
                  "compile_file", "build_guards")
_PHASE_LISTENERS: list[Callable[[str], None]] = []


@contextlib.contextmanager
def compile_events(on_compiled: Callable[[], None],
                   on_phase: Callable[[str], None] | None = None) -> Iterator[None]:
    """Call ``on_compiled()`` each time Dynamo finishes compiling a frame inside this block, and ``on_phase(name)``
    (where given) each time one of :data:`COMPILE_PHASES` starts.

    Uses ``torch._dynamo.callback.callback_handler`` (``register_end_callback`` / ``remove_end_callback``); the
    phases, the compile-time event logger's ``log_event_start`` (wrapped on the process's logger while a block with
    ``on_phase`` is open, in any thread: it reports every compile in the process then). Both are undone on exit,
    also after an error, and the callbacks run in the compiling thread, synchronously. Raises
    :class:`TorchAPIMissing` when this torch has no compile callback handler, or (with ``on_phase``) no event logger.
    """
    handler = _api("torch._dynamo.callback", "callback_handler", "compile progress")
    phases = contextlib.nullcontext() if on_phase is None else _compile_phases(on_phase)
    end = handler.register_end_callback(lambda _args: on_compiled())
    try:
        with phases:
            yield
    finally:
        handler.remove_end_callback(end)


@contextlib.contextmanager
def _compile_phases(on_phase: Callable[[str], None]) -> Iterator[None]:
    logger = _api("torch._dynamo.utils", "get_chromium_event_logger", "compile progress per phase")()
    if not callable(getattr(logger, "log_event_start", None)):
        raise TorchAPIMissing(f"compile progress per phase needs the compile event logger's log_event_start, which "
                              f"torch {torch.__version__} does not have; Steadfast is checked against torch 2.11/2.14")

    def apply() -> Callable[[], None]:
        own = logger.__dict__.get("log_event_start")  # an instance attribute someone else set, kept on undo
        start = logger.log_event_start

        def log_event_start(event_name: str, *args: Any, **kwargs: Any) -> Any:
            if event_name in COMPILE_PHASES:
                for listener in list(_PHASE_LISTENERS):
                    listener(event_name)
            return start(event_name, *args, **kwargs)

        def undo() -> None:
            if own is None:
                del logger.log_event_start
            else:
                logger.log_event_start = own

        logger.log_event_start = log_event_start
        return undo

    _PHASE_LISTENERS.append(on_phase)
    try:
        with _PHASE_PATCH.hold(apply):
            yield
    finally:
        _PHASE_LISTENERS.remove(on_phase)


def recompile_limit() -> int:
    """Dynamo's per-code-object compile limit (``recompile_limit``; ``cache_size_limit`` before torch 2.7).

    Past it Dynamo runs the frame eagerly (or fails with ``fullgraph``). Raises :class:`TorchAPIMissing`
    when neither setting exists. Imports ``torch._dynamo`` (seconds, the first time).
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


#: Set to 1 by an operator whose C++ compiler cannot build every vector ISA the CPU reports.
PROBE_CPU_ISA_ENV = "STEADFAST_PROBE_CPU_ISA"


def trusted_cpu_isa() -> contextlib.AbstractContextManager[Any]:
    """Context manager: inductor's CPU vector-ISA checks made cheap inside, restored after; a no-op when
    ``$STEADFAST_PROBE_CPU_ISA`` is 1.

    By default inductor checks each vector ISA the CPU reports (AVX512, AVX2 ...) by building a C++ test program and
    ``dlopen``-ing it in a child Python, once per process. Two changes, both scoped to the block:

    * ``cpp.vec_isa_ok = True`` (torch's ``config.patch``): the base checks trust the CPU's flags. The same ISA list
      and pick when the compiler builds them all, in 1.7 s instead of 8.0 s on a 2-core CPU
      (``tests/core/test_torch_compat.py`` measures and compares both); a compiler that cannot build an ISA makes
      the compile fail loudly (then set the variable).
    * :func:`fast_isa_probe_child`: the sub-feature probes that still run (VNNI, BF16, AMX, FP16) load their test
      library in a child that does not ``import torch``, as torch 2.14 does (docs/benchmarks.md section 13: 11
      children at about 2.2 s each on torch 2.11 made a warm start 2.5x slower).

    Caveat: inductor memoises the ISA list for the process, so it stays in force for later compiles in the process.
    Raises :class:`TorchAPIMissing` when inductor's config is gone.
    """
    if os.environ.get(PROBE_CPU_ISA_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return contextlib.nullcontext()
    cfg = _api("torch._inductor", "config", "skipping inductor's CPU ISA probes")
    stack = contextlib.ExitStack()
    stack.enter_context(cfg.patch({"cpp.vec_isa_ok": True}))
    stack.enter_context(fast_isa_probe_child())
    return stack


_COMPILE_ONLY: contextvars.ContextVar[tuple[Callable[[], Any], ...]] = contextvars.ContextVar(
    "steadfast_compile_only", default=())
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


#: The child script torch 2.14 runs for an ISA probe (``VecISA._avx_py_load``): ``dlopen`` the test library with
#: torch's libraries found through ``LD_LIBRARY_PATH`` (no ``import torch``); ``import torch`` only when that fails.
_ISA_PROBE_CHILD = """
from ctypes import cdll
try:
    cdll.LoadLibrary("__lib_path__")
except OSError:
    import torch  # noqa: F401
    cdll.LoadLibrary("__lib_path__")
"""


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


_ISA_PROBE_PATCH = _SharedPatch()
_PHASE_PATCH = _SharedPatch()  # compile_events' phases


@contextlib.contextmanager
def fast_isa_probe_child() -> Iterator[bool]:
    """Inside the block, inductor's ISA probe child (``torch._inductor.cpu_vec_isa.VecISA._avx_py_load``, run with
    the environment of ``cpu_vec_isa.python_subprocess_env``) loads the test library without ``import torch``:
    torch 2.14's own probe (``_ISA_PROBE_CHILD``, ``torch/lib`` first on the child's ``LD_LIBRARY_PATH``). Yields
    whether it patched: only on Linux, and only on a torch whose probe child imports torch (2.14 has
    ``VecISA._build_probe_env`` and needs nothing). Blocks may nest and overlap across threads: the first entry
    patches, the last exit restores both attributes; this process's environment is never changed. The probe's
    answer does not change: a library that fails to load without torch is retried with it, and
    ``tests/core/test_torch_compat.py`` compares the ISA list and pick with and without the patch.
    """
    isa = sys.modules.get("torch._inductor.cpu_vec_isa")
    if isa is None:
        isa = _api("torch._inductor", "cpu_vec_isa", "making inductor's CPU ISA probes cheap")

    def apply() -> Callable[[], None] | None:
        vec, old_env = getattr(isa, "VecISA", None), getattr(isa, "python_subprocess_env", None)
        if (not sys.platform.startswith("linux") or vec is None or hasattr(vec, "_build_probe_env")
                or old_env is None or "import torch" not in str(vec.__dict__.get("_avx_py_load", ""))):
            return None
        lib_dir, old_load = os.path.join(os.path.dirname(torch.__file__), "lib"), vec.__dict__["_avx_py_load"]

        def probe_env() -> dict[str, str]:
            env = dict(old_env())
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (lib_dir, env.get("LD_LIBRARY_PATH")) if p)
            return env

        def undo() -> None:
            vec._avx_py_load, isa.python_subprocess_env = old_load, old_env

        vec._avx_py_load, isa.python_subprocess_env = _ISA_PROBE_CHILD, probe_env
        return undo

    with _ISA_PROBE_PATCH.hold(apply) as patched:
        yield patched


#: The header a load under :func:`built_kernel_loads` hands inductor instead of a precompiled one (GCC's ``-include``
#: finds no ``.gch`` beside it and includes it as text).
_PLAIN_HEADER = "#include <{header}>\n"
_HEADER_PATCH = _SharedPatch()


def _plain_header_dir() -> str:
    """``<inductor's default cache folder>/steadfast_plain_headers``: a folder of the pack's, where no ``.gch`` is
    ever written (inductor's precompiled headers live in its ``precompiled_headers`` sibling)."""
    utils = _api("torch._inductor.runtime", "cache_dir_utils", "loading built kernels without inductor's header")
    return os.path.join(utils.default_cache_dir(), "steadfast_plain_headers")


def _plain_header(header: str, hashable_cmd_line: str, **compile_command: Any) -> str:
    """Stand-in for ``torch._inductor.codecache._precompile_header`` (same signature): the path of a header that
    only ``#include``-s ``header``, written once; nothing is preprocessed or compiled."""
    import hashlib

    folder = _plain_header_dir()
    path = os.path.join(folder, hashlib.sha256(header.encode()).hexdigest()[:32] + ".h")
    text = _PLAIN_HEADER.format(header=header)
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def checked_once(fn: Any) -> Any:
    """``fn`` (a loaded ``torch.compiler.load_compiled_function`` result) with its own guard check on each call
    turned off (``AOTCompiledFunction.disable_guard_check``), for a caller that runs ``fn.guard_check`` itself before
    every call and calls ``fn`` only when it passed: otherwise every call evaluates the same guards twice
    (docs/benchmarks.md section 19). Returns ``fn``. Raises :class:`TorchAPIMissing` when the method is gone."""
    disable = getattr(fn, "disable_guard_check", None)
    if disable is None or not hasattr(fn, "guard_check"):
        raise TorchAPIMissing(f"precompiled blocks need AOTCompiledFunction.guard_check and disable_guard_check, "
                              f"which torch {torch.__version__} does not have")
    disable()
    return fn


@contextlib.contextmanager
def built_kernel_loads() -> Iterator[bool]:
    """Inside the block, loading an inductor C++ kernel library skips preparing inductor's precompiled header.

    Why: on a cache miss in this process's memory, ``CppCodeCache.load_async`` (torch 2.11 and 2.14) first calls
    ``codecache._precompile_header``, which runs the compiler's preprocessor over inductor's kernel header and hashes
    its output (and builds the ``.gch`` when missing: seconds on a fresh machine), even when the library is already
    built and nothing will be compiled: 0.2-0.3 s of a warm first run on a 2-core CPU (docs/benchmarks.md section
    15). The header is chosen after the library's cache key is computed and is not part of it, so the same library
    is found. Inside the block the stand-in :func:`_plain_header` returns a header that only ``#include``-s the same
    file: a library that does have to be compiled is compiled without the precompiled header (slower, the same
    code; GCC's documented rule for ``-include`` of a header without a usable ``.gch``). For loads of kernels that
    are expected to be built (the pack's precompiled blocks); not for a jit compile, which would lose the speed-up.

    Yields whether it patched (False on a torch without ``codecache._precompile_header``). Blocks may nest and
    overlap across threads: the first entry patches, the last exit restores.
    """
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is None:
        codecache = _api("torch._inductor", "codecache", "loading built kernels without inductor's header")

    def apply() -> Callable[[], None] | None:
        original = getattr(codecache, "_precompile_header", None)
        if original is None:
            return None
        codecache._precompile_header = _plain_header

        def undo() -> None:
            codecache._precompile_header = original

        return undo

    with _HEADER_PATCH.hold(apply) as patched:
        yield patched


def pick_cpu_isa() -> str:
    """Inductor's CPU vector-ISA pick (``torch._inductor.cpu_vec_isa.pick_vec_isa``) made now, under
    :func:`trusted_cpu_isa`; returns its name (``"avx512"``, ``""`` for none).

    Inductor probes the ISAs once per process, at its first C++ kernel load or compile (0.07 s on torch 2.14, 0.27 s
    on 2.11 with the cheap probes, on a 2-core CPU: docs/benchmarks.md section 15); :mod:`core.compile.preload`
    calls this at server start so that a warm first prompt does not wait for it. Raises :class:`TorchAPIMissing`
    when the function is gone.
    """
    pick = _api("torch._inductor.cpu_vec_isa", "pick_vec_isa", "picking inductor's CPU vector ISA at start")
    with trusted_cpu_isa():
        return str(pick())


#: What ``torch.compile``'s first call imports (Dynamo, AOTAutograd, inductor's lowering and code generation).
COMPILE_STACK_MODULES = ("torch._dynamo", "torch._inductor.compile_fx")


def import_compile_stack() -> float:
    """Import :data:`COMPILE_STACK_MODULES` now; returns the seconds it took (about 0 when already imported).

    ``torch.compile`` imports them on its first call: 0.74-1.26 s on a 2-core CPU (docs/benchmarks.md section 13),
    paid by the first prompt that compiles unless something imported them earlier. Raises
    :class:`TorchAPIMissing` when a module is gone.
    """
    import time

    t0 = time.perf_counter()
    for module in COMPILE_STACK_MODULES:
        if module not in sys.modules:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise TorchAPIMissing(f"preloading the compile stack needs {module}, which torch "
                                      f"{torch.__version__} does not have ({e})") from e
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
    return (counters["frames"]["total"] + inductor["fxgraph_cache_hit"] + inductor["fxgraph_cache_miss"]
            + inductor["fxgraph_cache_bypass"])


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


def tensor_version(t: torch.Tensor) -> int | None:
    """The tensor's in-place version counter (``Tensor._version``): it grows with every in-place write, so a
    cached derivative (a quantized copy) can tell that the tensor's data changed. None for an inference tensor
    (made under ``torch.inference_mode``, as ComfyUI loads weights), which has no counter."""
    if t.is_inference():
        return None
    try:
        return int(t._version)
    except AttributeError as e:
        raise TorchAPIMissing(f"change detection needs Tensor._version, which torch {torch.__version__} does not "
                              f"have ({e})") from e


def orig_module(module: Any) -> Any:
    """The module an ``OptimizedModule`` (what ``torch.compile(module)`` returns) wraps: its ``_orig_mod``;
    ``module`` itself for anything else (a plain module, a function, None).

    Args:
        module: a ``torch.compile`` result or any other object.
    Returns:
        the original ``nn.Module`` (same object, not a copy), or ``module`` unchanged.
    """
    return getattr(module, "_orig_mod", module)


def has_compiled_call() -> bool:
    """Whether this torch's ``nn.Module`` has ``_compiled_call_impl``, the slot ``Module.compile()`` fills with the
    compiled ``_call_impl`` (compile in place, what diffusers' ``compile_repeated_blocks`` uses; torch >= 2.2)."""
    return hasattr(torch.nn.Module, "_compiled_call_impl")


def compiled_call(module: torch.nn.Module) -> Callable[..., Any] | None:
    """The compiled call ``module.compile()`` installed on ``module`` (``Module._compiled_call_impl``), or None when
    ``module`` was not compiled in place (or this torch has no such slot: see :func:`has_compiled_call`)."""
    return getattr(module, "_compiled_call_impl", None)


def set_compiled_call(module: torch.nn.Module, call: Callable[..., Any]) -> None:
    """Replace the compiled call of ``module`` (after ``module.compile()``) by ``call``, which every later
    ``module(...)`` runs instead of ``forward``.

    Raises:
        TorchAPIMissing: this torch's ``nn.Module`` has no ``_compiled_call_impl`` (wrapping the in-place compiled
            call of a ``Module.compile()``d block, e.g. to make its inputs contiguous, needs it).
    """
    if not has_compiled_call():
        raise TorchAPIMissing(f"wrapping a Module.compile()d call needs torch.nn.Module._compiled_call_impl, which "
                              f"torch {torch.__version__} does not have; Steadfast is checked against torch 2.13/2.14")
    module._compiled_call_impl = call


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


# ---------------------------------------------------------------------------------------------- inductor
def inductor_simdlen() -> int | None:
    """``torch._inductor.config.cpp.simdlen`` (the vector width inductor's C++ code targets; None = this CPU's widest).

    Returns None too when inductor is missing from this build. Imports inductor's config (about 1 s the first time).
    """
    try:
        return importlib.import_module(_INDUCTOR_CONFIG).cpp.simdlen
    except Exception:  # noqa: BLE001 - a torch build without inductor
        return None


def set_inductor_simdlen(bits: int) -> bool:
    """Set ``torch._inductor.config.cpp.simdlen`` to ``bits`` (portable CPU mode pins 256, the AVX2 width); returns
    whether inductor's config was there to set. Per thread on torch 2.14, process-wide on torch 2.11 (measured)."""
    try:
        importlib.import_module(_INDUCTOR_CONFIG).cpp.simdlen = bits
    except Exception:  # noqa: BLE001 - a torch build without inductor: compile is refused in portable mode anyway
        return False
    return True


def libtorch_cpu() -> Any:
    """``ctypes.CDLL`` of the ``libtorch_cpu`` shared library torch loaded (``<torch package>/lib``), for MKL's
    service functions linked into it (``mkl_serv_cbwr_get``, ``mkl_get_max_threads``); None where it is not there."""
    import ctypes
    from pathlib import Path

    lib = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        try:
            return ctypes.CDLL(str(lib / name))
        except OSError:
            continue
    return None


def inductor_mode_options(mode: str, dynamic: bool | None = None) -> dict[str, Any]:
    """The inductor config ``torch.compile(mode=mode)`` applies (``torch._inductor.list_mode_options``).

    ``"default"`` gives ``{}``. Raises ``ValueError`` for a mode torch does not know and
    :class:`TorchAPIMissing` when the function is gone. Imports ``torch._inductor`` (about 1 s the first time).
    """
    list_mode_options = _api("torch._inductor", "list_mode_options", "combining a compile mode with options")
    try:
        return dict(list_mode_options(mode, dynamic))
    except RuntimeError as e:  # "Unrecognized mode=..."
        raise ValueError(str(e)) from e


def clear_inductor_caches() -> bool:
    """Drop inductor's memoised cache paths (``torch._inductor.utils.clear_caches``), as torch's ``fresh_cache``
    does after changing ``TORCHINDUCTOR_CACHE_DIR``. Only when inductor is loaded (nothing is memoised
    otherwise); returns whether it cleared. Raises :class:`TorchAPIMissing` when loaded but the function is gone."""
    if "torch._inductor.utils" not in sys.modules:
        return False
    _api("torch._inductor.utils", "clear_caches", "switching the compile cache directory")()
    return True


def inductor_deterministic(load: bool = False) -> bool | None:
    """``torch._inductor.config.deterministic`` (part of inductor's FX-graph cache key).

    ``None`` when inductor's config is not loaded and ``load`` is False (reading then has no side effects);
    ``load=True`` imports it (about 1 s the first time). Raises :class:`TorchAPIMissing` when the setting is gone.
    """
    if sys.modules.get(_INDUCTOR_CONFIG) is None and not load:
        return None
    return bool(_api(_INDUCTOR_CONFIG, "deterministic", "reading inductor's deterministic flag"))


def set_inductor_deterministic(value: bool) -> bool:
    """Write ``torch._inductor.config.deterministic`` when inductor's config is loaded and differs; returns
    whether it wrote (``torch.use_deterministic_algorithms`` rewrites it; restoring puts the old value back)."""
    if sys.modules.get(_INDUCTOR_CONFIG) is None or inductor_deterministic() == bool(value):
        return False
    importlib.import_module(_INDUCTOR_CONFIG).deterministic = bool(value)
    return True


# ---------------------------------------------------------------------------------------------- fp32 precision
def has_fp32_precision_api() -> bool:
    """Whether this torch has the per-backend fp32 precision API (torch >= 2.9, ``torch._C`` getter/setter)."""
    return hasattr(torch._C, "_get_fp32_precision_getter") and hasattr(torch._C, "_set_fp32_precision_setter")


def get_fp32_precision(backend: str, op: str) -> str:
    """The fp32 precision of ``backend`` ("generic", "cuda", "mkldnn") for ``op`` ("all", "matmul", "conv",
    "rnn"): "ieee", "tf32", "bf16" or "none" (inherit). Raises :class:`TorchAPIMissing` before torch 2.9 and
    ``RuntimeError`` for a pair torch does not know."""
    return str(_api("torch._C", "_get_fp32_precision_getter", "reading fp32 precision")(backend, op))


def set_fp32_precision(backend: str, op: str, value: str) -> None:
    """Set the fp32 precision of ``backend``/``op`` (see :func:`get_fp32_precision`). Raises
    :class:`TorchAPIMissing` before torch 2.9 and ``RuntimeError`` for an unknown pair or value."""
    _api("torch._C", "_set_fp32_precision_setter", "setting fp32 precision")(backend, op, value)


# ---------------------------------------------------------------------------------------------- log tap
class _Forward(logging.Handler):
    """Passes each record's message to ``callback`` (only messages containing ``marker``, when given)."""

    def __init__(self, callback: Callable[[str], None], marker: str | None = None) -> None:
        super().__init__(level=logging.DEBUG)
        self._callback, self._marker = callback, marker

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if self._marker is None or self._marker in msg:
                self._callback(msg)
        except Exception:  # noqa: BLE001 - logging's convention: report on stderr, never break the logger's caller
            self.handleError(record)


@dataclasses.dataclass
class RecompileLogTap:
    """An installed tap (see :func:`install_recompile_log_tap`); ``note`` says whether reasons are captured."""

    note: str
    handlers: tuple[logging.Handler, logging.Handler]
    levels: dict[str, int]
    artifacts: set[str]
    changed_state: bool
    propagate: bool
    level: int
    removed: bool = False


def install_recompile_log_tap(on_recompile: Callable[[str], None],
                              on_limit_hit: Callable[[str], None]) -> RecompileLogTap:
    """Route Dynamo's recompile messages to ``on_recompile`` and its recompile-limit warnings to ``on_limit_hit``.

    Enables torch's ``recompiles`` log artifact (``torch._logging.set_logs(recompiles=True)`` from a default
    state, else added to the current state) unless ``TORCH_LOGS`` is set (torch then ignores ``set_logs``; the
    note says whether the user's setting captures reasons). Adds a handler to ``RECOMPILES_LOGGER`` (with
    ``propagate=False``, so stderr stays quiet) and one to ``CONVERT_FRAME_LOGGER`` (messages containing
    "hit config."). Everything is recorded in the returned tap; :func:`remove_recompile_log_tap` undoes it.
    Process-global. Raises :class:`TorchAPIMissing` when torch's logging state is not where it was.
    """
    internal = _api("torch._logging", "_internal", "capturing recompile reasons")
    state = _api("torch._logging._internal", "log_state", "capturing recompile reasons")
    levels, artifacts = dict(state.log_qname_to_level), set(state.artifact_names)
    rec_logger, cf_logger = logging.getLogger(RECOMPILES_LOGGER), logging.getLogger(CONVERT_FRAME_LOGGER)
    propagate, level = rec_logger.propagate, rec_logger.level
    changed = False
    if "TORCH_LOGS" in os.environ:
        on = "recompiles" in artifacts or "recompiles_verbose" in artifacts
        note = "TORCH_LOGS is set: recompile reasons " + ("captured" if on else
                                                          "NOT captured (add 'recompiles' to TORCH_LOGS)")
    elif "recompiles" not in artifacts:
        if not levels and not artifacts:
            torch._logging.set_logs(recompiles=True)  # the public way, from a default state
        else:  # keep the user's other settings: add the artifact to the current state
            state.enable_artifact("recompiles")
            internal._init_logs()
        changed = True
        note = "recompile logging enabled by Steadfast (restored when the tap is removed)"
    else:
        note = "recompile logging was already enabled"
    handlers = (_Forward(on_recompile), _Forward(on_limit_hit, marker="hit config."))
    rec_logger.addHandler(handlers[0])
    rec_logger.propagate = False
    cf_logger.addHandler(handlers[1])
    return RecompileLogTap(note, handlers, levels, artifacts, changed, propagate, level)


def remove_recompile_log_tap(tap: RecompileLogTap) -> None:
    """Undo :func:`install_recompile_log_tap`: remove both handlers, restore torch's logging state (levels,
    artifacts) and the recompile logger's ``propagate`` and level. A second call does nothing."""
    if tap.removed:
        return
    tap.removed = True
    rec_logger = logging.getLogger(RECOMPILES_LOGGER)
    rec_logger.removeHandler(tap.handlers[0])
    logging.getLogger(CONVERT_FRAME_LOGGER).removeHandler(tap.handlers[1])
    if tap.changed_state:
        if not tap.levels and not tap.artifacts:
            torch._logging.set_logs()
        else:
            internal = _api("torch._logging", "_internal", "restoring torch's logging state")
            internal.log_state.clear()
            internal.log_state.log_qname_to_level.update(tap.levels)
            internal.log_state.artifact_names.update(tap.artifacts)
            internal._init_logs()
    rec_logger.propagate = tap.propagate
    rec_logger.setLevel(tap.level)


# ---------------------------------------------------------------------------------------------- AOT compile
#: Set to 0 by an operator to turn precompiled blocks off (1 turns them on where torch's default is off).
PRECOMPILED_ENV = "STEADFAST_PRECOMPILED"


def aot_compile_support() -> tuple[bool, str]:
    """Whether this torch can save and load a compiled function (``torch.compile(fn).aot_compile(...)``,
    ``save_compiled_function``, ``torch.compiler.load_compiled_function``, the setting
    ``torch._dynamo.config.enable_aot_compile``).

    Returns:
        ``(on, reason)``: on when the APIs exist (torch 2.11 and 2.14; 2.11's default for the setting is off,
        the pack turns it on while saving: :func:`aot_compile_enabled`) unless ``$STEADFAST_PRECOMPILED`` is 0;
        ``reason`` says which.
    """
    switch = os.environ.get(PRECOMPILED_ENV, "").strip().lower()
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
        f"on (torch {torch.version.__version__}: enable_aot_compile turned on while saving)")


def aot_compile_enabled() -> contextlib.AbstractContextManager[Any]:
    """Context manager: ``torch._dynamo.config.enable_aot_compile = True`` inside (torch's ``config.patch``), so that
    ``torch.compile(fn)`` made inside offers ``.aot_compile``. Raises :class:`TorchAPIMissing` without the setting."""
    cfg = _api("torch._dynamo", "config", "precompiled blocks (aot_compile)")
    if not hasattr(cfg, "enable_aot_compile"):
        raise TorchAPIMissing(f"precompiled blocks need torch._dynamo.config.enable_aot_compile, which torch "
                              f"{torch.version.__version__} does not have")
    return cfg.patch(enable_aot_compile=True)


def guard_serialisable(entry: Any) -> bool:
    """Whether an aot_compile artifact can keep the Dynamo guard ``entry`` (a ``GuardFilterEntry``) and still load.

    False for global guards, the types in ``torch._dynamo.guards.CheckFunctionManager.
    UNSUPPORTED_SERIALIZATION_GUARD_TYPES``, guards naming ``__closure__``, ``__mro__`` or ``type(`` (the function
    holding the cell is not saved: load fails with ``'_Missing'``), and TYPE_MATCH/BUILTIN_MATCH guards on a nested
    class (ComfyUI's ``operations`` layers: not importable by name). Measured on torch 2.11 and 2.14
    (docs/benchmarks.md section 13). Raises :class:`TorchAPIMissing` when the guard manager class is gone.
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
    (``empty_strided(): argument 'dtype' must be torch.dtype, not _Missing``; torch 2.11 with ComfyUI 0.33's SD1.5,
    and torch 2.11 and 2.14 with ``tests/fixtures/precompiled_child.py``'s block).
    Inside the block, ``GuardsStatePickler.reducer_override`` pickles those types normally (their value is the
    same object everywhere); everything else is unchanged. The class attribute is put back in ``finally``;
    process-wide while active. Raises :class:`TorchAPIMissing` when the pickler class or method is gone.
    """
    pickler = _api("torch._dynamo.guards", "GuardsStatePickler", "precompiled blocks (guard state pickling)")
    original = pickler.__dict__.get("reducer_override")
    if original is None:
        raise TorchAPIMissing(f"torch {torch.version.__version__}: torch._dynamo.guards.GuardsStatePickler has no "
                              "reducer_override (precompiled blocks)")
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
        raise TorchAPIMissing(f"precompiled blocks need the traced sources of an aot_compile result "
                              f"(AOTCompiledFunction.source_info.inlined_sources), which torch "
                              f"{torch.version.__version__} does not have")
    return {str(s.module) for s in sources}


#: Config entries that set how a compile runs on this machine, not what it produces (left out of
#: :func:`compile_config_digest`, so an artifact made on a machine with other cores matches).
MACHINE_CONFIG_KEYS = {"torch._inductor.config": ("compile_threads",),
                       "torch._dynamo.config": ()}
_config_digests: dict[tuple, str] = {}


def compile_config_digest() -> str:
    """sha256 (16 hex) of Dynamo's and inductor's config, the entries torch hashes for its own caches
    (``ConfigModule.get_hash``: everything but the ``compile_ignored`` entries), without
    :data:`MACHINE_CONFIG_KEYS`, values in a canonical form (sets sorted), so the digest is the same on another
    machine with the same config.

    Memoised on ``get_hash()`` of both modules (torch caches it until a config entry is written): about 2 us a call
    when nothing changed. Covers ``TORCHINDUCTOR_*`` environment variables (read into the config at import) and
    any later write to ``torch._inductor.config`` or ``torch._dynamo.config``, a ``config.patch`` included.
    Raises :class:`TorchAPIMissing` when a config module or its ``get_hash`` is gone.
    """
    import hashlib

    mods = [importlib.import_module(name) for name in MACHINE_CONFIG_KEYS]
    try:
        probe = tuple(m.get_hash() for m in mods)
    except AttributeError as e:
        raise TorchAPIMissing(f"precompiled blocks need ConfigModule.get_hash, which torch {torch.__version__} "
                              f"does not have ({e})") from e
    got = _config_digests.get(probe)
    if got is None:
        h = hashlib.sha256()
        for m, name in zip(mods, MACHINE_CONFIG_KEYS):
            ignored = [*getattr(m, "_compile_ignored_keys", ()), *MACHINE_CONFIG_KEYS[name]]
            try:  # torch 2.14 copies values read-only; 2.11 has no such argument
                entries = m._get_dict(ignored_keys=ignored, readonly_values=True)
            except TypeError:
                entries = m._get_dict(ignored_keys=ignored)
            for k, v in sorted(entries.items()):
                h.update(f"{name}.{k}={_canonical(v)}\n".encode())
        got = _config_digests[probe] = h.hexdigest()[:16]
    return got


def _canonical(v: Any) -> str:
    if isinstance(v, set | frozenset):
        return "{" + ",".join(sorted(map(_canonical, v))) + "}"
    if isinstance(v, dict):
        items = sorted(v.items(), key=lambda i: repr(i[0]))
        return "{" + ",".join(f"{_canonical(k)}:{_canonical(x)}" for k, x in items) + "}"
    if isinstance(v, list | tuple):
        return "[" + ",".join(map(_canonical, v)) + "]"
    if callable(v):
        return f"{getattr(v, '__module__', '?')}.{getattr(v, '__qualname__', type(v).__qualname__)}"
    return repr(v)


def module_hook_dicts() -> tuple[dict, ...]:
    """torch's process-wide module hook dicts (``torch.nn.modules.module._global_forward_hooks`` and its
    siblings: forward, forward pre, backward, backward pre, ``_global_forward_hooks_with_kwargs``): a hook
    registered with ``register_module_forward_hook`` runs for every module. Raises :class:`TorchAPIMissing` when
    none is found."""
    mod = importlib.import_module("torch.nn.modules.module")
    names = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
             "_global_backward_pre_hooks", "_global_forward_hooks_with_kwargs")
    found = tuple(d for d in (getattr(mod, n, None) for n in names) if isinstance(d, dict))
    if not found:
        raise TorchAPIMissing(f"precompiled blocks need torch.nn.modules.module._global_forward_hooks, which torch "
                              f"{torch.__version__} does not have")
    return found


def operator_name(fn: Any) -> str | None:
    """The qualified name of a torch operator object, or None when ``fn`` is not one.

    A trace that calls ``torch.ops.<namespace>.<op>`` (ComfyUI 0.33's Flux calls
    ``torch.ops.comfy_kitchen.apply_rope``) guards the packet by identity; the precompiled blocks carry that guard
    by this name (:func:`core.compile.carried_guards.describe_callable`).

    Args:
        fn: any value.
    Returns:
        ``"op aten::add"`` for an ``OpOverloadPacket``, ``"op aten::add.Tensor"`` for an ``OpOverload``, None
        otherwise (``torch._ops`` missing included: then no operator can be described).
    """
    ops = sys.modules.get("torch._ops")
    if ops is None:
        return None
    packet, overload = getattr(ops, "OpOverloadPacket", None), getattr(ops, "OpOverload", None)
    if packet is not None and isinstance(fn, packet):
        name = getattr(fn, "_qualified_op_name", None)
        return f"op {name}" if isinstance(name, str) else None
    if overload is not None and isinstance(fn, overload):
        try:
            return f"op {fn.name()}"
        except Exception:  # noqa: BLE001 (an overload without a readable name: not describable)
            return None
    return None


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
