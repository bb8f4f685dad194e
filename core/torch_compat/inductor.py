"""Inductor: its config (CPU ISA, deterministic, SIMD width, mode options), kernel loads and the config digest.

Part of :mod:`core.torch_compat` (its face re-exports every public name); no ComfyUI imports."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .. import switches
from .base import TorchAPIMissing, _api, _SharedPatch

INDUCTOR_DETERMINISTIC_SETTING = "torch._inductor.config.deterministic"


_INDUCTOR_CONFIG = "torch._inductor.config"


#: Set to 1 by an operator whose C++ compiler cannot build every vector ISA the CPU reports.
PROBE_CPU_ISA_ENV = switches.PROBE_CPU_ISA.name


def trusted_cpu_isa() -> contextlib.AbstractContextManager[Any]:
    """Context manager: inductor's CPU vector-ISA checks made cheap inside, restored after; a no-op when
    ``$STEADFAST_PROBE_CPU_ISA`` is 1.

    By default inductor checks each vector ISA the CPU reports (AVX512, AVX2 ...) by building a C++ test program and
    ``dlopen``-ing it in a child Python, once per process. Two changes, both scoped to the block:

    * ``cpp.vec_isa_ok = True`` (torch's ``config.patch``): the base checks trust the CPU's flags. The same ISA list
      and pick when the compiler builds them all (``tests/core/test_torch_compat.py`` compares both; times:
      docs/benchmarks.md section 5); a compiler that cannot build an ISA makes the compile fail loudly (then set
      the variable).
    * :func:`fast_isa_probe_child`: the sub-feature probes that still run (VNNI, BF16, AMX, FP16) load their test
      library in a child that does not ``import torch``, as torch 2.14 does (docs/benchmarks.md section 13).

    Caveat: inductor memoises the ISA list for the process, so it stays in force for later compiles in the process.
    Raises :class:`TorchAPIMissing` when inductor's config is gone.
    """
    if switches.PROBE_CPU_ISA.on():
        return contextlib.nullcontext()
    cfg = _api("torch._inductor", "config", "skipping inductor's CPU ISA probes")
    stack = contextlib.ExitStack()
    stack.enter_context(cfg.patch({"cpp.vec_isa_ok": True}))
    stack.enter_context(fast_isa_probe_child())
    return stack


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


_ISA_PROBE_PATCH = _SharedPatch()


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
        if (
            not sys.platform.startswith("linux")
            or vec is None
            or hasattr(vec, "_build_probe_env")
            or old_env is None
            or "import torch" not in str(vec.__dict__.get("_avx_py_load", ""))
        ):
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


@contextlib.contextmanager
def built_kernel_loads() -> Iterator[bool]:
    """Inside the block, loading an inductor C++ kernel library skips preparing inductor's precompiled header.

    Why: on a cache miss in this process's memory, ``CppCodeCache.load_async`` first calls
    ``codecache._precompile_header``, which runs the compiler's preprocessor over inductor's kernel header and hashes
    its output (and builds the ``.gch`` when missing), even when the library is already built and nothing will be
    compiled (cost: docs/benchmarks.md section 15). The header is chosen after the library's cache key is computed and
    is not part of it, so the same library is found. Inside the block the stand-in :func:`_plain_header` returns a
    header that only ``#include``-s the same file: a library that does have to be compiled is compiled without the
    precompiled header (slower, the same code; GCC's documented rule for ``-include`` of a header without a usable
    ``.gch``). For loads of kernels that are expected to be built (the pack's precompiled blocks); not for a jit
    compile, which would lose the speed-up.
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

    Inductor probes the ISAs once per process, at its first C++ kernel load or compile (cost: docs/benchmarks.md
    section 15); :mod:`core.compile.warm.preload` calls this at server start so that a warm first prompt does not wait
    for it. Raises :class:`TorchAPIMissing` when the function is gone.
    """
    pick = _api("torch._inductor.cpu_vec_isa", "pick_vec_isa", "picking inductor's CPU vector ISA at start")
    with trusted_cpu_isa():
        return str(pick())


def inductor_simdlen() -> int | None:
    """``torch._inductor.config.cpp.simdlen`` (the vector width inductor's C++ code targets; None = this CPU's widest).

    Returns None too when inductor is missing from this build. Imports inductor's config.
    """
    try:
        return importlib.import_module(_INDUCTOR_CONFIG).cpp.simdlen
    except Exception:  # noqa: BLE001 - a torch build without inductor
        return None


def set_inductor_simdlen(bits: int) -> bool:
    """Set ``torch._inductor.config.cpp.simdlen`` to ``bits`` (portable CPU mode pins 256, the AVX2 width); returns
    whether inductor's config was there to set. Per thread on torch 2.14, process-wide on torch 2.11."""
    try:
        importlib.import_module(_INDUCTOR_CONFIG).cpp.simdlen = bits
    except Exception:  # noqa: BLE001 - a torch build without inductor: compile is refused in portable mode anyway
        return False
    return True


@functools.cache
def libtorch_cpu() -> Any:
    """``ctypes.CDLL`` of the ``libtorch_cpu`` shared library torch loaded (``<torch package>/lib``), for MKL's
    service functions linked into it (``mkl_serv_cbwr_get``, ``mkl_get_max_threads``); None where it is not there.
    Opened once per process (every run record reads MKL's settings through it)."""
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
    :class:`TorchAPIMissing` when the function is gone. Imports ``torch._inductor``.
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
    ``load=True`` imports it. Raises :class:`TorchAPIMissing` when the setting is gone.
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


#: Config entries that set how a compile runs on this machine, not what it produces (left out of
#: :func:`compile_config_digest`, so an artifact made on a machine with other cores matches).
MACHINE_CONFIG_KEYS = {"torch._inductor.config": ("compile_threads",), "torch._dynamo.config": ()}


_config_digests: dict[tuple, str] = {}


def compile_config_digest() -> str:
    """sha256 (16 hex) of Dynamo's and inductor's config, the entries torch hashes for its own caches
    (``ConfigModule.get_hash``: everything but the ``compile_ignored`` entries), without
    :data:`MACHINE_CONFIG_KEYS`, values in a canonical form (sets sorted), so the digest is the same on another
    machine with the same config.

    Memoised on ``get_hash()`` of both modules (torch caches it until a config entry is written). Covers
    ``TORCHINDUCTOR_*`` environment variables (read into the config at import) and any later write to
    ``torch._inductor.config`` or ``torch._dynamo.config``, a ``config.patch`` included. Raises
    :class:`TorchAPIMissing` when a config module or its ``get_hash`` is gone.
    """
    import hashlib

    mods = [importlib.import_module(name) for name in MACHINE_CONFIG_KEYS]
    try:
        probe = tuple(m.get_hash() for m in mods)
    except AttributeError as e:
        raise TorchAPIMissing(
            f"precompiled blocks need ConfigModule.get_hash, which torch {torch.__version__} does not have ({e})"
        ) from e
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
