"""What leaves the server: errors, reports and route answers with ComfyUI's folders instead of absolute paths.

:func:`public` rewrites a text with :func:`core.paths.redact`, the roots being ComfyUI's model folders
(``models/loras/x.safetensors``), its input/output/temp folders and its install folder. :func:`guard_node`
wraps a node's ``execute`` (plain or ``async def``) so that any exception raised in it (ours, diffusers',
ComfyUI's own) reaches the client without an absolute path in its message; the exception keeps its type and
traceback. The server's log keeps the full text: before the rewritten exception goes on to ComfyUI (which logs
it as ``!!! Exception during processing !!!`` with its traceback, ``execution.py``), the wrapper logs the
original message, paths included, on the ``steadfast`` logger at ERROR (ComfyUI's log shows it just above).
What is not the pack's to rewrite: ComfyUI's own ``traceback`` field of the ``execution_error`` message (the
frames' source files, absolute paths) and its ``current_inputs``.

Interrupts (ComfyUI's ``InterruptProcessingException``) and out-of-memory errors pass through untouched: ComfyUI
decides on their type and text (``comfy.model_management.is_oom``: unload all models, the memory tip).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os

import folder_paths

from ...core.failures import passes_through
from ...core.paths import redact, redact_value

log = logging.getLogger("steadfast")


def roots() -> list[tuple[str, str]]:
    """``(absolute folder, label)`` for ComfyUI's folders: each model folder (``models/<name>`` when it lies
    in the models folder, else ``<name> folder``), models, input, output, temp and the install folder (``ComfyUI``).

    Returns:
        the pairs, in no particular order (:func:`core.paths.display_path` tries the longest first).
    """
    models = getattr(folder_paths, "models_dir", "")
    base = getattr(folder_paths, "base_path", "")
    out: list[tuple[str, str]] = []
    for name, entry in getattr(folder_paths, "folder_names_and_paths", {}).items():
        for path in entry[0]:
            inside = models and os.path.abspath(path).startswith(os.path.abspath(models) + os.sep)
            out.append(
                (
                    path,
                    "models/" + os.path.relpath(path, models).replace(os.sep, "/") if inside else f"<{name} folder>",
                )
            )
    for label, getter in (
        ("input", "get_input_directory"),
        ("output", "get_output_directory"),
        ("temp", "get_temp_directory"),
    ):
        fn = getattr(folder_paths, getter, None)
        if fn is not None:
            out.append((fn(), label))
    if models:
        out.append((models, "models"))
    if base:
        out.append((base, "ComfyUI"))
    return out


def public(text: str) -> str:
    """``text`` with absolute paths shown relative to ComfyUI's folders (see :func:`roots`).

    Args:
        text: an error message or report.
    Returns:
        the text a client may see.
    """
    return redact(text, roots())


def public_value(value):
    """:func:`public` on every string inside a JSON-like ``value`` (for route answers).

    Args:
        value: dicts, lists and scalars.
    Returns:
        a redacted copy.
    """
    return redact_value(value, roots())


_PACK = __name__.rsplit(".nodes.", 1)[0]  # ComfyUI imports the pack under its folder's absolute path


def _public_module(cls: type) -> None:
    """An exception class of this pack gets the module name ``steadfast.<sub.module>``: ComfyUI shows
    ``module.QualName`` as the error's type, and its module name for a custom node is the folder's path."""
    if _PACK != "steadfast" and cls.__module__.startswith(_PACK + "."):
        cls.__module__ = "steadfast" + cls.__module__[len(_PACK) :]


def _redact_exception(e: BaseException) -> bool:
    """Rewrite ``e`` in place so that ``str(e)`` and its type name hold no absolute path (traceback kept).
    Returns whether its text changed."""
    before = str(e)
    for cls in type(e).__mro__:
        _public_module(cls)
    if isinstance(e, OSError):
        for attr in ("filename", "filename2"):
            value = getattr(e, attr, None)
            if isinstance(value, str):
                setattr(e, attr, public(value))
    try:
        e.args = tuple(public(a) if isinstance(a, str) else a for a in e.args)
    except (AttributeError, TypeError):
        pass
    text = str(e)
    clean = public(text)
    if clean != text:  # a type with its own __str__: same name and module, that text redacted
        cls = type(e)
        try:
            e.__class__ = type(
                cls.__name__,
                (cls,),
                {"__str__": lambda self, _t=clean: _t, "__module__": cls.__module__, "__qualname__": cls.__qualname__},
            )
        except TypeError:
            pass
    return str(e) != before


def _public_failure(node: str, e: BaseException) -> None:
    """Rewrite ``e`` for clients (unless an interrupt or OOM); log its original text for the operator first."""
    if passes_through(e):  # an interrupt or OOM: ComfyUI acts on its type and text (core/failures.py)
        return
    original = f"{type(e).__qualname__}: {e}"
    if _redact_exception(e):
        log.error(
            "Steadfast %s failed; the client sees this error without absolute paths. Original: %s", node, original
        )


def guard_node(cls: type) -> type:
    """Make ``cls.execute`` raise its exceptions without absolute paths in their text (the log keeps them).

    Args:
        cls: a V3 ``io.ComfyNode`` subclass with an ``execute`` classmethod, plain or ``async def`` (then the
            wrapper is a coroutine function too, and rewrites what its awaited result raises).
    Returns:
        ``cls`` (changed in place). ``validate_inputs`` is left alone: ComfyUI reads its argument names.
    """
    func = cls.__dict__["execute"].__func__
    name = cls.__name__

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def execute(klass, *args, **kwargs):
            try:
                return await func(klass, *args, **kwargs)
            except Exception as e:
                _public_failure(name, e)
                raise
    else:

        @functools.wraps(func)
        def execute(klass, *args, **kwargs):
            try:
                return func(klass, *args, **kwargs)
            except Exception as e:
                _public_failure(name, e)
                raise

    cls.execute = classmethod(execute)
    return cls
