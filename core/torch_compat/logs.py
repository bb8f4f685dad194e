"""torch's compile logs and events: the recompile log tap and the compile progress events (Dynamo's callbacks, the
compile-time event logger).

Part of :mod:`core.torch_compat` (its face re-exports every public name); no ComfyUI imports."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .base import TorchAPIMissing, _api, _SharedPatch

#: Dynamo's loggers the recompile log tap listens on.
RECOMPILES_LOGGER = "torch._dynamo.guards.__recompiles"


CONVERT_FRAME_LOGGER = "torch._dynamo.convert_frame"


#: The compile phases :func:`compile_events` reports to ``on_phase`` as each starts, in the order one frame's compile
#: starts them: Dynamo's trace of the frame, the backend (AOT autograd), inductor's lowering, its code generation,
#: the C++ build of the generated code (once per file), Dynamo's guards. They are names of torch's compile-time
#: events (``dynamo_timed``, logged through ``torch._dynamo.utils.get_chromium_event_logger()``, torch 2.11 and
#: 2.14); a phase that does not run (another backend, an inductor cache hit) is not reported.
COMPILE_PHASES = (
    "entire_frame_compile",
    "backend_compile",
    "GraphLowering.run",
    "Scheduler.codegen",
    "compile_file",
    "build_guards",
)


_PHASE_LISTENERS: list[Callable[[str], None]] = []


@contextlib.contextmanager
def compile_events(on_compiled: Callable[[], None], on_phase: Callable[[str], None] | None = None) -> Iterator[None]:
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
        raise TorchAPIMissing(
            f"compile progress per phase needs the compile event logger's log_event_start, which "
            f"torch {torch.__version__} does not have; Steadfast is checked against torch 2.11/2.14"
        )

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


_PHASE_PATCH = _SharedPatch()  # compile_events' phases


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


def install_recompile_log_tap(
    on_recompile: Callable[[str], None], on_limit_hit: Callable[[str], None]
) -> RecompileLogTap:
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
        note = "TORCH_LOGS is set: recompile reasons " + (
            "captured" if on else "NOT captured (add 'recompiles' to TORCH_LOGS)"
        )
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
