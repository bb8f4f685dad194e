"""The precompiled route's state per compile record: on or off with the reason, its counters and per-phase seconds,
the reasons the jit answered, which variants answered, the memo of entries per call key and the saves queued until
the tracked call ends. No ComfyUI imports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ... import switches, torch_compat
from .call_key import flags_text

if TYPE_CHECKING:
    from .variants import Answer

__all__ = ["MAX_PENDING", "SPLIT_PHASES", "Entry", "PrecompiledState"]

log = logging.getLogger("steadfast.precompiled")


def _checks_kind(answer: Answer) -> str:
    """How an answer's per-call checks run: ``"one guard tree"`` (torch's and the pack's together), ``"guard tree"``
    (the pack's beside the artifact's), ``"python"``."""
    if getattr(answer, "combined", None) is not None:
        return "one guard tree"
    return "guard tree" if answer.checks is not None else "python"


class Entry(enum.Enum):
    """What the route does with one call key in this process (:attr:`PrecompiledState.entries`)."""

    ANSWERS = "aot"  #: loaded artifacts answer it (with the list of :class:`~.variants.Answer` s)
    JIT = "jit"  #: the jit answers (an untrusted record, a refused configuration, a failed load or call)
    #: this process is saving this configuration, failed to, or read its own save back without an answer: its jit
    #: answers (PrecompiledState.saved)
    SAVED = "saved"
    NEW = "new"  #: no artifact for this configuration yet: the jit answers and it is saved
    #: never stored: what the route's lookup of a call says when a loaded answer's one tree (torch's guards and the
    #: pack's checks, :attr:`~.variants.Answer.combined`) passed, so the answer is called without a second check
    PASSED = "passed"


MAX_PENDING = 64  # queued saves (each holds one call's inputs) until PrecompiledState.flush


#: the phases of a block call through the route whose wall seconds :class:`PrecompiledState` sums (where a steady
#: step's per-call cost goes): the hook walk (:func:`hooks_reason`), the call key (:func:`call_key`), the
#: carried guards' re-check (with one tree: the binder only), torch's ``guard_check`` of the artifact (with one tree:
#: that tree, the pack's checks included), and the artifact's own call (its kernels)
SPLIT_PHASES = ("hooks", "key", "carried", "guard_check", "artifact")


@dataclasses.dataclass(eq=False)
class PrecompiledState:
    """One compile record's precompiled route: on/off with the reason, counts, and per-key fallback reasons.

    ``hits``: calls answered by a loaded artifact; ``loads`` / ``saves``: artifacts read from / written to the
    cache; ``fallbacks``: calls that ran the jit although the route was on; ``reasons``: ``{key digest (12 hex or
    "call"): reason}``, the first reason per key (a refusal's reason names every problem); ``answered``:
    ``{variant id (12 hex): {"root": traced root path, "checks": "one guard tree" | "guard tree" | "python",
    "hits": n}}``, which variants answered and how their per-call checks ran (:func:`checks_tree`). Thread-safe."""

    enabled: bool
    reason: str
    #: ``$STEADFAST_PRECOMPILED`` turned the route on explicitly: also on devices outside :data:`TRIED_DEVICES`
    explicit: bool = False
    hits: int = 0
    loads: int = 0
    saves: int = 0
    fallbacks: int = 0
    save_seconds: float = 0.0
    load_seconds: float = 0.0
    check_seconds: float = 0.0
    #: wall seconds per phase of the route's block calls, summed (:data:`SPLIT_PHASES`)
    split_seconds: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(SPLIT_PHASES, 0.0))
    calls: int = 0
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)
    answered: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    pending: list[Callable[[], None]] = dataclasses.field(default_factory=list, repr=False)
    #: (cache path, call key) -> (Entry.ANSWERS, [Answer, ...]): the variants loaded for it | (Entry.JIT, None):
    #: the jit answers it
    entries: dict[tuple, tuple[Entry, Any]] = dataclasses.field(default_factory=dict, repr=False)
    #: (cache path, call key) -> each save this process made for the key: ``("values", the transformer_options
    #: values it specialised on)`` (:func:`.variants.specialisation`) once recorded, ``("failed", values)`` for a
    #: refusal or a failed save (``()`` after an error: every call), or ``("queued", the call's values of the
    #: sources the key's done saves specialised on)`` until it is saved (None for the key's first save: every call
    #: waits for it). A call holding other values (another block position) saves its own variant
    saved: dict[tuple, list] = dataclasses.field(default_factory=dict, repr=False)
    #: ((cache path, call key), values) of this process's recorded saves read back: the next call holding values this
    #: process saved reads the key's record once, as a warm-started process would, and its own artifact answers
    read_back: set[tuple] = dataclasses.field(default_factory=set, repr=False)
    #: (cache path, call key) -> {the call's simple transformer_options values: its save, if still needed}: calls that
    #: waited for their key's first save (run by :meth:`flush` after it)
    deferred: dict[tuple, dict] = dataclasses.field(default_factory=dict, repr=False)
    #: (cache path, variant) -> the loaded artifact (one load per variant and process)
    loaded: dict[tuple, Any] = dataclasses.field(default_factory=dict, repr=False)
    load_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    interned: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    memo_flags: str | None = dataclasses.field(default=None, repr=False)
    scoped: int = dataclasses.field(default=0, repr=False)

    @classmethod
    def detect(cls) -> PrecompiledState:
        """On when :func:`core.torch_compat.aot_compile_support` says so (``$STEADFAST_PRECOMPILED``)."""
        on, why = torch_compat.aot_compile_support()
        explicit = switches.PRECOMPILED.on()
        return cls(on, why, explicit=on and explicit)

    def hit(self, answer: Answer) -> None:
        """One call answered by ``answer``: counted in ``hits`` and under its variant in ``answered``."""
        with self.lock:
            self.hits += 1
            seen = self.answered.get(answer.variant[:12])
            if seen is None and len(self.answered) < 256:
                seen = self.answered[answer.variant[:12]] = {
                    "root": answer.root,
                    "checks": _checks_kind(answer),
                }
                seen["hits"] = 0
            if seen is not None:
                seen["hits"] += 1

    def count(self, what: str, key: str | None = None, reason: str | None = None, seconds: float = 0.0) -> None:
        """Add one to a counter, keep the first ``reason`` per key (at most 64 keys; logged at INFO).

        Args:
            what: "hits", "loads", "saves" or "fallbacks".
            key: the key digest's first 12 hex digits, or None for a call without a key ("call").
            reason: why the jit answered (fallbacks), None otherwise.
            seconds: wall seconds of a load or save (summed in ``load_seconds`` / ``save_seconds``).
        """
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)
            if what == "saves":
                self.save_seconds += seconds
            elif what == "loads":
                self.load_seconds += seconds
            if reason is not None and (key or "call") not in self.reasons and len(self.reasons) < 64:
                self.reasons[key or "call"] = reason
                log.info("Steadfast precompiled block %s: %s", key or "", reason)

    @contextlib.contextmanager
    def call_scope(self) -> Iterator[None]:
        """One model call: the global flags are read once for all its block calls (:func:`flags_text`), not per
        block; the adapter wraps each ``apply_model`` in it. Not re-entrant across threads (one model call at a
        time per record, as ComfyUI runs them)."""
        previous, self.memo_flags = self.memo_flags, None
        self.scoped += 1
        try:
            yield
        finally:
            self.scoped -= 1
            self.memo_flags = previous

    def flags(self) -> str:
        """:func:`flags_text`, memoised inside :meth:`call_scope`."""
        if not self.scoped:
            return flags_text()
        if self.memo_flags is None:
            self.memo_flags = flags_text()
        return self.memo_flags

    def intern(self, value: dict[str, Any]) -> dict[str, Any]:
        """The one object equal to ``value`` (JSON-equal) among those interned so far: blocks with equal
        fingerprints share it, hence their call keys, artifacts and saves."""
        with self.lock:
            return self.interned.setdefault(json.dumps(value, sort_keys=True, default=repr), value)

    def flush(self) -> int:
        """Run the saves queued by the calls so far (after the tracked call: their traces are not counted as the
        record's graphs), then the deferred ones (:attr:`deferred`: calls of other block positions that waited for
        their key's first save, saved now when the values it specialised on differ). Returns how many ran. Call with
        the compile cache active."""
        with self.lock:
            todo, self.pending = self.pending, []
        for save in todo:
            save()
        with self.lock:
            later = [fn for by_desc in self.deferred.values() for fn in by_desc.values()]
            self.deferred = {}
        for maybe_save in later:
            maybe_save()
        return len(todo) + len(later)

    def as_dict(self) -> dict[str, Any]:
        """JSON view: ``{"enabled", "reason", "hits", "loads", "saves", "fallbacks", "save_seconds", "load_seconds",
        "check_seconds", "calls", "split_seconds", "reasons", "answered"}`` (``check_seconds``: wall seconds of the
        per-call checks of the traced code and the carried guards, summed over every call; ``calls``: block calls
        through the route; ``split_seconds``: their wall seconds per phase, :data:`SPLIT_PHASES`)."""
        with self.lock:
            return {
                "enabled": self.enabled,
                "reason": self.reason,
                "hits": self.hits,
                "loads": self.loads,
                "saves": self.saves,
                "fallbacks": self.fallbacks,
                "save_seconds": round(self.save_seconds, 3),
                "load_seconds": round(self.load_seconds, 3),
                "check_seconds": round(self.check_seconds, 6),
                "calls": self.calls,
                "split_seconds": {k: round(v, 6) for k, v in self.split_seconds.items()},
                "reasons": dict(self.reasons),
                "answered": {k: dict(v) for k, v in self.answered.items()},
            }
