"""Every ``STEADFAST_*`` environment switch, declared once: its name, what it does, the values it takes, its default,
and who reads it.

Two kinds (:attr:`Switch.scope`):

* ``"pack"``: read by the pack in a ComfyUI server or by the ``steadfast`` command (the compile cache and its
  artifacts, the precompiled route, the warm start, portable CPU mode, the tiny model's cache, the web root of a
  started server). Code reads them through :class:`Switch` (:meth:`Switch.text`, :meth:`Switch.on`,
  :meth:`Switch.off`), never by spelling the name.
* ``"set-up"``: read by the README's two commands, CI and the benchmarks (``scripts/*.sh``, ``.ci/run``,
  ``tests/``): the tested row, the venv, the browser, the frontend. Declared here so that one table names them all.

``tests/repo/test_switches.py`` fails when a ``STEADFAST_*`` name appears anywhere in the repository without being
declared here, when a declared one is used nowhere, when Python code outside this module reads one by its spelled
name, and when the table in docs/architecture.md (:func:`markdown_table`) is stale. No imports beyond the standard
library.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

__all__ = [
    "Switch",
    "SWITCHES",
    "COMPILE_CACHE",
    "PRECOMPILED",
    "COMPILE_ARTIFACT",
    "COMPILE_ARTIFACT_SHA256",
    "COMPILE_ARTIFACT_UNPINNED",
    "COMPILE_ARTIFACT_MAX_BYTES",
    "PRELOAD_COMPILE",
    "GC_FREEZE",
    "PROBE_CPU_ISA",
    "PORTABLE",
    "PORTABLE_THREADS",
    "CACHE",
    "FRONT_END_ROOT",
    "by_name",
    "markdown_table",
]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Switch:
    """One environment switch.

    Attributes:
        name: the variable (``STEADFAST_...``).
        meaning: what it does, one sentence.
        values: what it takes.
        default: what holds when it is unset.
        read_by: the module or script that reads it.
        scope: ``"pack"`` (a server or the ``steadfast`` command) or ``"set-up"`` (the README's commands, CI,
            benchmarks).
    """

    name: str
    meaning: str
    values: str
    default: str
    read_by: str
    scope: str = "pack"

    def text(self, environ: Mapping[str, str] | None = None) -> str:
        """The value, surrounding whitespace stripped; ``""`` when unset (``environ``: default ``os.environ``)."""
        return (os.environ if environ is None else environ).get(self.name, "").strip()

    def on(self, environ: Mapping[str, str] | None = None) -> bool:
        """Set to ``1``, ``true``, ``yes`` or ``on`` (any case)."""
        return self.text(environ).lower() in _TRUE

    def off(self, environ: Mapping[str, str] | None = None) -> bool:
        """Set to ``0``, ``false``, ``no`` or ``off`` (any case); unset is neither on nor off."""
        return self.text(environ).lower() in _FALSE


COMPILE_CACHE = Switch(
    "STEADFAST_COMPILE_CACHE",
    "the operator's folder of compile caches (inductor's and the precompiled blocks')",
    "a folder; `off`, `0`, `none` or `disabled` turns the cache off",
    "`<ComfyUI user dir>/steadfast/compile_cache`",
    "core/compile/warm/cache_location.py",
)
PRECOMPILED = Switch(
    "STEADFAST_PRECOMPILED",
    "the precompiled route (regional blocks answered by saved `aot_compile` artifacts)",
    "`0` off; `1` on, also on a device the route has not passed its checks on (CUDA)",
    "on where the route has passed its checks (the CPU), off elsewhere",
    "core/torch_compat/aot.py, core/compile/warm/route_state.py",
)
COMPILE_ARTIFACT = Switch(
    "STEADFAST_COMPILE_ARTIFACT",
    "compile artifacts a server imports into its cache at start (a fleet's warm start)",
    "paths separated by the OS path separator",
    "none",
    "core/compile/warm/artifact.py, nodes/host/startup.py",
)
COMPILE_ARTIFACT_SHA256 = Switch(
    "STEADFAST_COMPILE_ARTIFACT_SHA256",
    "the sha256 of each artifact in `STEADFAST_COMPILE_ARTIFACT`, in order (a tampered file is refused)",
    "hex digests separated by commas",
    "none (an artifact without one is refused)",
    "core/compile/warm/artifact.py, headless/artifact_cli.py",
)
COMPILE_ARTIFACT_UNPINNED = Switch(
    "STEADFAST_COMPILE_ARTIFACT_UNPINNED",
    "import an artifact that has no sha256 (with a warning)",
    "`1`",
    "refused",
    "core/compile/warm/artifact.py",
)
COMPILE_ARTIFACT_MAX_BYTES = Switch(
    "STEADFAST_COMPILE_ARTIFACT_MAX_BYTES",
    "the most bytes an imported artifact may list",
    "an integer",
    "16 GiB",
    "core/compile/warm/artifact.py",
)
PRELOAD_COMPILE = Switch(
    "STEADFAST_PRELOAD_COMPILE",
    "import the compile stack when ComfyUI loads the pack (a warm start's first prompt pays no import)",
    "`1` always, `0` never, `auto`",
    "`auto`: when the cache root holds a compiled file",
    "core/compile/warm/preload.py",
)
GC_FREEZE = Switch(
    "STEADFAST_GC_FREEZE",
    "freeze the heap after the preload (full collections stop walking torch's objects)",
    "`0` leaves it unfrozen",
    "frozen",
    "core/compile/warm/preload.py",
)
PROBE_CPU_ISA = Switch(
    "STEADFAST_PROBE_CPU_ISA",
    "let inductor build its test program per CPU ISA instead of trusting the CPU's flags",
    "`1`",
    "the CPU's flags are trusted",
    "core/torch_compat/inductor.py",
)
PORTABLE = Switch(
    "STEADFAST_PORTABLE",
    "portable CPU mode: oneDNN off, threads and inductor's `simdlen` pinned at import (`steadfast run --portable`)",
    "`1`",
    "off",
    "core/determinism/portable.py",
)
PORTABLE_THREADS = Switch(
    "STEADFAST_PORTABLE_THREADS",
    "the thread count portable CPU mode pins",
    "an integer",
    "1",
    "core/determinism/portable.py",
)
CACHE = Switch(
    "STEADFAST_CACHE",
    "where the `steadfast` command keeps the embedded tiny checkpoint it builds",
    "a folder",
    "`~/.cache/steadfast`",
    "headless/tiny_sd15.py",
)
FRONT_END_ROOT = Switch(
    "STEADFAST_FRONT_END_ROOT",
    "a web root passed as `--front-end-root` to the ComfyUI servers the `steadfast` command and the tests start",
    "a folder",
    "ComfyUI's own frontend package",
    "headless/comfy_server.py",
)


def _setup(name: str, meaning: str, values: str, default: str, read_by: str) -> Switch:
    return Switch(name, meaning, values, default, read_by, scope="set-up")


#: every switch, the pack's first, then the set-up's
SWITCHES: tuple[Switch, ...] = (
    COMPILE_CACHE,
    PRECOMPILED,
    COMPILE_ARTIFACT,
    COMPILE_ARTIFACT_SHA256,
    COMPILE_ARTIFACT_UNPINNED,
    COMPILE_ARTIFACT_MAX_BYTES,
    PRELOAD_COMPILE,
    GC_FREEZE,
    PROBE_CPU_ISA,
    PORTABLE,
    PORTABLE_THREADS,
    CACHE,
    FRONT_END_ROOT,
    _setup(
        "STEADFAST_COMFYUI", "the tested row", "`0.33.0`, `0.8.0`", "`0.33.0`", "scripts/setup_env.sh, scripts/test.sh"
    ),
    _setup(
        "STEADFAST_VENV", "the row's virtual environment", "a folder", "`~/comfy/venv-<row>`", "scripts/setup_env.sh"
    ),
    _setup("STEADFAST_PYTHON", "the Python that makes the venv", "a command", "`python3`", "scripts/setup_env.sh"),
    _setup(
        "STEADFAST_SNAPSHOTS",
        "the folder holding the ComfyUI source snapshots",
        "a folder",
        "`../shared/comfyui`",
        "scripts/setup_env.sh",
    ),
    _setup(
        "STEADFAST_TORCH_PINS",
        "the torch packages the row installs",
        "pip requirements",
        "the row's",
        "scripts/setup_env.sh",
    ),
    _setup("STEADFAST_NO_CLONE", "skip trying a git clone of ComfyUI", "`1`", "tried", "scripts/setup_env.sh"),
    _setup("STEADFAST_NO_BROWSER", "skip installing the browser", "`1`", "installed", "scripts/setup_env.sh"),
    _setup(
        "STEADFAST_CHROMIUM",
        "the browser the frontend tests drive",
        "a path",
        "`/usr/bin/chromium`",
        "scripts/setup_env.sh",
    ),
    _setup(
        "STEADFAST_FRONTEND",
        "the frontend version the newer-frontend browser suite installs",
        "a version",
        "`1.53.10`",
        "scripts/test_newer_frontend.sh",
    ),
    _setup(
        "STEADFAST_FRONTEND_DIR",
        "where that frontend is installed",
        "a folder",
        "`~/comfy/frontend-<version>`",
        "scripts/test_newer_frontend.sh",
    ),
    _setup("STEADFAST_CI_SERIAL", "run CI's rows one after the other", "`1`", "two lanes", ".ci/run"),
    _setup(
        "STEADFAST_ARTIFACTS",
        "where tests write screenshots and logs",
        "a folder",
        "`test-artifacts/` in the checkout",
        "tests/comfy/conftest.py",
    ),
    _setup(
        "STEADFAST_MATRIX_SAMPLERS",
        "the samplers the sampler matrix test runs",
        "names separated by commas",
        "all",
        "tests/comfy/test_sampler_matrix.py",
    ),
    _setup(
        "STEADFAST_PROTOCOL_SCALE",
        "the model scale the GPU protocol's smoke test runs",
        "an integer (`--scale`)",
        "4",
        "tests/comfy/test_gpu_protocol_smoke.py",
    ),
    _setup(
        "STEADFAST_TEST_V2_TOKEN",
        "the variable the v2 tests hand their token in (`steadfast run --token-env STEADFAST_TEST_V2_TOKEN`)",
        "set by the test, never by a person",
        "no token",
        "tests/comfy/test_steadfast_run_v2.py",
    ),
)


def by_name(name: str) -> Switch:
    """The declared switch ``name``. Raises ``KeyError`` for an undeclared one."""
    for switch in SWITCHES:
        if switch.name == name:
            return switch
    raise KeyError(f"{name} is not declared in core/switches.py")


def markdown_table() -> str:
    """The switches as the markdown table docs/architecture.md holds (one row each, in :data:`SWITCHES` order)."""
    rows = ["| switch | scope | what it does | values | unset | read by |", "|---|---|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.scope} | {s.meaning} | {s.values} | {s.default} | {s.read_by} |" for s in SWITCHES]
    return "\n".join(rows) + "\n"
