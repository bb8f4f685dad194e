"""The identity of a precompiled block from what its trace ran: every code object Dynamo traced, by the path
through which this process reaches it, with a digest of the function found there.

Dynamo guards the values a trace reads, not the code it ran: a method of a submodule's class, the block's own class
``forward`` or a module-level helper can be replaced (another node pack patching a ComfyUI class) and an artifact
traced before the change still passes every guard. A file on disk is no identity either: the code a process runs is
what it imported, and a file updated after import (or a patch living in the same file) says nothing about it.

So a variant records, at trace time, for each traced code object (:func:`core.torch_compat.traced_code_objects`):

* its **path**, how this process reaches it: ``method <module>:<Class>.<attr>`` for a method found on the class of
  the block or of one of its submodules (looked up along the class's MRO, as Python's attribute lookup does), and
  ``function <module>:<qualname>`` for any other function reachable by its qualified name from its module;
* its **digest** (:func:`function_digest`): the code object (bytecode, names, constants, nested code), the
  positional and keyword defaults, and the values of its closure cells.

A nested function (``<locals>`` in its qualified name) is covered when a traced function contains its code (the
parent's digest includes nested code) or when the key or a carried guard describes it (a closure passed in
``transformer_options`` or held by the block); otherwise the trace cannot be identified and no artifact is made.

At load, :func:`resolve` finds each path in this process and compares the digests: a path that does not resolve, or
resolves to other code, refuses the artifact. :class:`CodeIdentity` then keeps the objects it found and re-checks
them per call by identity (:meth:`CodeIdentity.still`), so a class patched after the artifact answered once is
seen on the next call.

Module names are made portable (:func:`portable_module`): ComfyUI imports a custom node pack under its absolute
folder path (``nodes.load_custom_node``: ``sys_module_name = module_path.replace(".", "_x_")``), so the pack's own
modules are named ``steadfast`` and another pack's by its folder's name, whatever folder it is installed in.

torch's own precompile (the ``SourceInfo`` of Dynamo's package module) records the traced code by module name, line
numbers and a sha256 of the source text read back from disk (``inspect.getsourcelines``), and ``_CompilePackage``
checks a loaded package against the source on disk again: it shares the flaw of a file updated after import, so the
pack does not use those checksums. No ComfyUI imports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import os
import sys
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "PACK_TOKEN",
    "portable_module",
    "local_module",
    "function_digest",
    "code_digest",
    "identify",
    "resolve",
    "CodeIdentity",
    "root_forward",
    "root_function",
    "build_tree",
    "folder_named_modules",
    "module_aliases",
]

#: the portable name of this pack's root package, whatever folder ComfyUI loaded it from
PACK_TOKEN = "steadfast"
_PACK_ROOT = __name__.rsplit(".core.", 1)[0] if ".core." in __name__ else None
_SEPARATORS = tuple({os.sep, "/", "\\"})
_code_digests: dict[types.CodeType, str] = {}


def portable_module(name: str) -> str:
    """The name of module ``name`` as any process with the same code names it.

    Args:
        name: a ``__module__`` or ``sys.modules`` key.
    Returns:
        this pack's modules as ``steadfast[.sub.module]``; a module ComfyUI imported under a folder path
        (``/x/custom_nodes/Pack_x_v2.sub`` ...) as ``custom_nodes/<folder name>[.sub]``; any other name unchanged.
    """
    if _PACK_ROOT is not None and (name == _PACK_ROOT or name.startswith(_PACK_ROOT + ".")):
        return PACK_TOKEN + name[len(_PACK_ROOT) :]
    if any(sep in name for sep in _SEPARATORS):
        cut = max(name.rfind(sep) for sep in _SEPARATORS)
        head, dot, rest = name[cut + 1 :].partition(".")
        return f"custom_nodes/{head}{dot}{rest}"
    return name


_local_names: dict[str, str] = {}  # portable name -> sys.modules key, refreshed on a miss


def local_module(portable: str) -> types.ModuleType | None:
    """The loaded module whose :func:`portable_module` name is ``portable``, or None when none is loaded.

    The portable names of ``sys.modules`` are kept between calls and rebuilt when a name is not found or no longer
    names that module (modules come and go; their count alone does not say which: two test modules swapped kept the
    count and answered from a stale table)."""
    direct = sys.modules.get(portable)
    if direct is not None and portable_module(portable) == portable:
        return direct
    name = _local_names.get(portable)
    if name is None or name not in sys.modules:
        fresh = {portable_module(n): n for n in list(sys.modules)}
        _local_names.clear()
        _local_names.update(fresh)
        name = fresh.get(portable)
    return None if name is None else sys.modules.get(name)


def code_digest(code: types.CodeType) -> str:
    """sha256 (16 hex) of a code object's bytecode, names, argument counts, flags and constants (nested code
    objects recursively); file names and line numbers are left out, so the same code installed elsewhere gives the
    same digest."""
    got = _code_digests.get(code)
    if got is None:
        h = hashlib.sha256(code.co_code)
        h.update(
            repr(
                (
                    code.co_names,
                    code.co_varnames,
                    code.co_freevars,
                    code.co_cellvars,
                    code.co_argcount,
                    code.co_posonlyargcount,
                    code.co_kwonlyargcount,
                    code.co_flags,
                )
            ).encode()
        )
        for const in code.co_consts:
            h.update(code_digest(const).encode() if isinstance(const, types.CodeType) else _const_text(const))
        got = _code_digests[code] = h.hexdigest()[:16]
    return got


def _const_text(value: Any) -> bytes:
    return f"{type(value).__name__}:{value!r}".encode()


def _value_text(value: Any) -> str:
    """Portable text of a default or a closure cell's value: constants by value, functions by their digest, modules
    and classes by portable name, anything else by its type (an object's state is the guards' business)."""
    if isinstance(value, str | int | float | bool | bytes | type(None)):
        return f"{type(value).__name__}:{value!r}"
    if type(value) in (tuple, list, frozenset):
        return type(value).__name__ + "(" + ",".join(_value_text(v) for v in value) + ")"
    if isinstance(value, types.FunctionType):
        return f"fn {portable_module(value.__module__)}.{value.__qualname__}#{code_digest(value.__code__)}"
    if isinstance(value, types.ModuleType):
        return f"module {portable_module(value.__name__)}"
    if isinstance(value, type):
        return f"class {portable_module(value.__module__)}.{value.__qualname__}"
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device"):
        return f"{type(value).__name__}:{value}"
    return f"object {portable_module(type(value).__module__)}.{type(value).__qualname__}"


def function_digest(fn: types.FunctionType) -> str:
    """sha256 (16 hex) of what a function runs: :func:`code_digest` of its code, its positional and keyword-only
    defaults and the values of its closure cells (constants by value, functions by their code; Dynamo guards no
    constant default). Equal for the same function installed in another folder; never raises."""
    parts = [code_digest(fn.__code__)]
    parts.append(_value_text(fn.__defaults__ or ()))
    parts.append(_value_text(tuple(sorted((fn.__kwdefaults__ or {}).items()))))
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(_value_text(cell.cell_contents))
        except ValueError:  # an empty cell
            cells.append("empty")
    parts.append(",".join(cells))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _function(value: Any) -> types.FunctionType | None:
    """The function behind a class attribute or module attribute (staticmethod, classmethod, bound method,
    ``functools.wraps`` chains are not followed: the traced code is the wrapper's)."""
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    if isinstance(value, types.MethodType):
        value = value.__func__
    return value if isinstance(value, types.FunctionType) else None


def _lookup(cls: type, attr: str) -> Any:
    """``attr`` as Python's attribute lookup finds it on ``cls`` (first in the MRO), without binding; raises
    ``AttributeError``."""
    for klass in cls.__mro__:
        if attr in klass.__dict__:
            return klass.__dict__[attr]
    raise AttributeError(attr)


def _walk(owner: Any, qualname: str) -> Any:
    obj = owner
    for part in qualname.split("."):
        obj = _lookup(obj, part) if isinstance(obj, type) else getattr(obj, part)
    return obj


def _nested_codes(code: types.CodeType) -> Iterable[types.CodeType]:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _nested_codes(const)


def identify(block: Any, codes: Sequence[types.CodeType], described: str = "") -> tuple[dict[str, str], list[str]]:
    """The paths and digests of the code a block's trace ran.

    Args:
        block: the original (uncompiled) block the trace ran (an ``nn.Module``).
        codes: the traced code objects (:func:`core.torch_compat.traced_code_objects`).
        described: text of what else identifies the call (the key's call description and the carried guards): a
            nested function whose code digest appears there is covered.
    Returns:
        ``(paths, problems)``: ``{path: digest}`` for every traced code object reached by a path (the root
        ``forward`` of ``type(block)`` always among them), and one text per code object that could not be
        identified; the artifact may be used only when ``problems`` is empty.
    """
    wanted = {c for c in codes}
    found: dict[types.CodeType, tuple[str, str]] = {}
    root = _function(_lookup(type(block), "forward"))
    if root is not None:
        found[root.__code__] = (_method_path(type(block), "forward"), function_digest(root))
    for cls in dict.fromkeys(type(m) for m in block.modules()):
        for klass in cls.__mro__:
            for attr, value in klass.__dict__.items():
                fn = _function(value)
                if fn is None or fn.__code__ not in wanted or fn.__code__ in found:
                    continue
                if _function(_lookup(cls, attr)) is fn:  # the attribute the instance's class resolves to
                    found[fn.__code__] = (_method_path(cls, attr), function_digest(fn))
    problems, reported = [], set()
    for code, (path, _) in list(found.items()):
        try:
            _resolve_one(path)
        except LookupError as e:  # a class defined in a function, or not where its name says
            problems.append(f"{e}: another process could not find it")
            del found[code]  # kept out of the record, so a refusal of this configuration is found again
            reported.add(code)
    covered = {n for c in found for n in _nested_codes(c)}
    pending = [c for c in dict.fromkeys(codes) if c not in found and c not in reported]
    progress = True
    while progress:  # a nested function is covered once its parent is, whatever the trace's order
        progress = False
        for code in list(pending):
            if code in covered:
                pending.remove(code)
                progress = True
                continue
            path, fn, _ = _function_path(code)
            if fn is not None:
                found[code] = (path, function_digest(fn))
            elif f"#{code_digest(code)}" not in described:  # a closure the key or a carried guard describes
                continue
            covered.update(_nested_codes(code))
            pending.remove(code)
            progress = True
    problems.extend(_function_path(code)[2] for code in pending)
    return dict(sorted(found.values())), problems


def _method_path(cls: type, attr: str) -> str:
    return f"method {portable_module(cls.__module__)}:{cls.__qualname__}.{attr}"


def _function_path(code: types.CodeType) -> tuple[str, types.FunctionType | None, str]:
    """``(path, function, problem)`` for a traced code object outside the block's classes: the function its module
    holds under its qualified name, when that function runs exactly this code."""
    qualname = getattr(code, "co_qualname", code.co_name)
    what = f"traced code {qualname} ({os.path.basename(code.co_filename)})"
    if "<locals>" in qualname or "<lambda>" in qualname:
        return "", None, f"{what} is a nested function that neither its parent's code, the key nor a guard covers"
    module = inspect.getmodule(code)
    if module is None:
        return "", None, f"{what} belongs to no loaded module"
    try:
        fn = _function(_walk(module, qualname))
    except AttributeError:
        fn = None
    if fn is None or fn.__code__ is not code:
        return "", None, f"{what} is not what {module.__name__}.{qualname} holds"
    return f"function {portable_module(module.__name__)}:{qualname}", fn, ""


def _resolve_one(path: str) -> types.FunctionType:
    """The function a path names in this process; ``LookupError`` naming what is missing."""
    kind, _, rest = path.partition(" ")
    module_name, _, qualname = rest.partition(":")
    module = local_module(module_name)
    if module is None or kind not in ("method", "function") or not qualname:
        raise LookupError(f"{path}: module {module_name} is not loaded")
    try:
        fn = _function(_walk(module, qualname))
    except AttributeError as e:
        raise LookupError(f"{path}: not found ({e})") from e
    if fn is None:
        raise LookupError(f"{path}: not a Python function here")
    return fn


def resolve(paths: Mapping[str, str]) -> tuple[CodeIdentity | None, list[str]]:
    """Whether the recorded code is what this process runs.

    Args:
        paths: ``{path: digest}`` recorded with the variant (:func:`identify`).
    Returns:
        ``(CodeIdentity, [])`` when every path resolves to a function with the recorded digest; ``(None, problems)``
        otherwise, every path that does not named (not only the first).
    """
    fns, problems = [], []
    for path, want in paths.items():
        try:
            fn = _resolve_one(path)
        except LookupError as e:
            problems.append(f"{e}")
            continue
        now = function_digest(fn)
        if now != want:
            problems.append(f"{path} runs other code ({now}, traced {want})")
            continue
        fns.append((path, fn))
    if problems:
        return None, problems
    return CodeIdentity.of(fns), []


@dataclasses.dataclass(frozen=True)
class CodeIdentity:
    """The functions a variant's paths resolved to in this process, re-checked per call by identity: each path's
    owner still holds the same function object, with the same code, defaults and closure objects."""

    paths: tuple[str, ...]
    steps: tuple[tuple[Any, str, types.FunctionType, Any, Any, Any], ...]

    @classmethod
    def of(cls, fns: Sequence[tuple[str, types.FunctionType]]) -> CodeIdentity:
        steps = []
        for path, fn in fns:
            module_name, _, qualname = path.partition(" ")[2].partition(":")
            owner_name, _, attr = qualname.rpartition(".")
            module = local_module(module_name)
            owner = _walk(module, owner_name) if owner_name else module
            steps.append((owner, attr, fn, fn.__code__, fn.__defaults__, fn.__kwdefaults__))
        return cls(tuple(p for p, _ in fns), tuple(steps))

    def module_functions(self) -> dict[tuple[int, str], types.CodeType]:
        """``{(id(module.__dict__), name): code}`` of the paths that read a plain module attribute (a function at
        module level): :func:`build_tree` pins the object there and its ``__code__`` on every call, so a carried
        guard that the same entry holds that code adds nothing
        (:func:`core.compile.warm.carried_guards.build_tree`)."""
        return {
            (id(vars(owner)), attr): code
            for owner, attr, fn, code, *_ in self.steps
            if isinstance(owner, types.ModuleType) and vars(owner).get(attr) is fn
        }

    def still(self) -> bool:
        """True when every path still resolves to the function matched, unchanged (a few hundred nanoseconds per
        path: one attribute lookup and four identity checks)."""
        for owner, attr, fn, code, defaults, kwdefaults in self.steps:
            try:
                now = _function(_lookup(owner, attr) if isinstance(owner, type) else getattr(owner, attr))
            except AttributeError:
                return False
            if now is not fn or fn.__code__ is not code or fn.__defaults__ is not defaults:
                return False
            if code.co_kwonlyargcount and fn.__kwdefaults__ is not kwdefaults:  # read only for keyword-only ones
                return False
        return True


def root_forward(block: Any) -> tuple[str, str]:
    """``(path, digest)`` of ``type(block).forward`` (:func:`function_digest`; ``"?"`` when it is no Python
    function): the part of a block's identity known before any trace, so a process whose block class is patched
    keys its artifacts apart from one whose class is not."""
    cls = type(block)
    try:
        fn = _function(_lookup(cls, "forward"))
    except AttributeError:
        fn = None
    return _method_path(cls, "forward"), function_digest(fn) if fn is not None else "?"


def root_function(block: Any) -> Any:
    """The object ``type(block).forward`` resolves to now (compared by identity to see a patch of the class)."""
    try:
        return _lookup(type(block), "forward")
    except AttributeError:
        return None


def build_tree(tree: Any, identity: CodeIdentity) -> None:
    """Add the per-call checks of ``identity`` to ``tree`` (:class:`core.torch_compat.GuardTree`): for each path, its
    owner (a class or a module, held as a constant) gives the same function object, with the same ``__code__``,
    ``__defaults__`` and ``__kwdefaults__`` objects, as C++ identity leaves; no ``__kwdefaults__`` leaf for a code
    object without keyword-only parameters (``co_kwonlyargcount == 0``, pinned by the ``__code__`` leaf: CPython
    reads a function's keyword defaults only to fill keyword-only parameters). A path whose attribute access does
    not give the function itself (a classmethod, a descriptor) is checked by a Python test inside the tree, as
    :meth:`CodeIdentity.still` does. Raises what torch's builders raise (the caller keeps the Python check)."""
    for path, (owner, attr, fn, code, defaults, kwdefaults) in zip(identity.paths, identity.steps):
        parts = f"{path} is the traced code"
        base = tree.constant(owner, path.partition(":")[0])
        if getattr(owner, attr, None) is not fn:  # not a plain attribute: the lookup CodeIdentity.still does
            tree.holds(base, lambda o, attr=attr, fn=fn: _function(_lookup(o, attr)) is fn, parts)
            continue
        got = tree.attr(base, attr, path, fn)
        tree.is_(got, fn, parts)
        tree.is_(tree.attr(got, "__code__", f"{path}.__code__", code), code, f"{path}: its __code__")
        tree.is_(tree.attr(got, "__defaults__", f"{path}.__defaults__", defaults), defaults, f"{path}: its defaults")
        if code.co_kwonlyargcount:
            kw = tree.attr(got, "__kwdefaults__", f"{path}.__kwdefaults__", kwdefaults)
            tree.is_(kw, kwdefaults, f"{path}: its keyword defaults")


def folder_named_modules() -> dict[str, str]:
    """``{portable name: the name it is imported under here}`` of the loaded modules ComfyUI named by a folder path
    (this pack's and other packs'): an ``aot_compile`` artifact pickles the modules its code and guards use by that
    name, so a replica with the pack in another folder must map them back (:func:`module_aliases`)."""
    return {p: n for n in list(sys.modules) if (p := portable_module(n)) != n}


@contextlib.contextmanager
def module_aliases(saved: Mapping[str, str]) -> Iterator[None]:
    """Inside the block, each module the saving process imported under a folder-path name (``saved``: its
    :func:`folder_named_modules`) is also reachable under that name here, when this process has the same module under
    its own folder's name; the names added are removed after. Used only while loading an artifact."""
    added = []
    for portable, name in saved.items():
        if name in sys.modules:
            continue
        module = local_module(portable)
        if module is not None:
            sys.modules[name] = module
            added.append(name)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)
