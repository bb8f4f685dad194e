"""The Dynamo guards a precompiled block's artifact cannot carry, carried by the pack beside it.

torch serialises an ``aot_compile`` artifact's guards only for some guard types and sources
(Dynamo's ``CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES``, global sources, closures:
:func:`core.torch_compat.guard_serialisable`), so :func:`core.compile.warm.precompiled.aot_guard_filter` drops those. A
dropped guard is a fact the jit checks on every call and the artifact does not: a module global the block reads
(ComfyUI's ``optimized_attention``, chosen by command-line flags), a function attribute and its closure cells, the
``weight_function`` lists of ComfyUI's ``comfy.ops`` layers, a ``type(...)`` check. Each one the jit keeps becomes a
:class:`CarriedGuard`: the guard's source expression, what it compares (:data:`GUARD_KINDS`) and a portable text of
the value at trace time. They are saved beside the artifact (:mod:`core.compile.warm.precompiled`) and checked before
each
use: an artifact is used only when every carried guard describes the same value now, so a precompiled call is the
call the jit would have traced. A guard whose value cannot be described across processes (:class:`NotDescribable`)
gives no artifact, with the reason.

Guard kinds and what the pack does with each:

* ``ID_MATCH``, ``FUNCTION_MATCH``, ``BUILTIN_MATCH``, ``MODULE_MATCH``, ``CLASS_MATCH``: identity. Described as
  module and qualified name (functions: also a digest of their code and the values of their closure cells,
  :func:`describe_callable`); checked per call by identity with the object matched in this process.
* ``CLOSURE_MATCH``: the function's code (Dynamo compares ``__code__``). Described by name and code digest.
* ``TYPE_MATCH``: the value's class, by module and qualified name.
* ``CONSTANT_MATCH``, ``EQUALS_MATCH``: the value (str, int, float, bool, None, dtype, device, tuples of those).
* ``SEQUENCE_LENGTH``, ``LIST_LENGTH``, ``DICT_LENGTH``, ``EMPTY_NN_MODULE_HOOKS_DICT``, ``LENGTH_CHECK``: ``len``.
* ``DICT_KEYS``, ``DICT_KEYS_MATCH``: the keys, in order.
* ``DUPLICATE_INPUT``: two sources are one object (``G['F']`` and ``G['torch'].nn.functional``). Carried as
  ``"<source> is <other source>"``.
* ``DICT_CONTAINS`` (torch 2.14: ``DICT_NOT_CONTAINS``): whether a key is in a dict (a class ``__dict__``
  without an attribute an instance may shadow). Carried as ``"<key> in <source>"``.
* anything else (``DICT_VERSION``, ``NN_MODULE``, ``WEAKREF_ALIVE``, ``HASATTR``...): not describable: no artifact.

Guard sources are Dynamo's source names (``G['F'].linear``, ``self._modules['s'].weight_function[0]``,
``self.fn.__closure__[0].cell_contents``, ``type(x)``), read once by one small parser (:func:`parse_source`: names,
attributes, constant subscripts, ``type(...)``, ``dict(...)`` (read as the mapping itself), ``is`` and ``'key' in``;
no ``eval``). Its result is walked two ways: to read a value (:func:`read_source`, when a guard is carried and when a
variant is matched) and to build the per-call checks as leaves of Dynamo's C++ guard tree (:func:`build_tree`),
sharing each prefix (``self._modules['attn1']``); :meth:`Matched.still` reads the same sources in Python only for a
torch without those guards. ``G['__import_<module>']`` is that module (Dynamo's alias for the globals of inlined
functions from other modules). No ComfyUI imports.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import enum
import functools
import inspect
import re
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ... import torch_compat
from .traced_code import code_digest, function_digest, local_module, portable_module

__all__ = [
    "GUARD_KINDS",
    "NotDescribable",
    "CarriedGuard",
    "carry",
    "Binder",
    "Matched",
    "match",
    "describe_callable",
    "code_digest",
    "build_tree",
    "read_source",
    "parse_source",
    "portable_source",
]

#: Dynamo guard type -> what the carried guard compares.
GUARD_KINDS: dict[str, str] = {
    "ID_MATCH": "is",
    "FUNCTION_MATCH": "is",
    "BUILTIN_MATCH": "is",
    "MODULE_MATCH": "is",
    "CLASS_MATCH": "is",
    "CLOSURE_MATCH": "code",
    "TYPE_MATCH": "type",
    "CONSTANT_MATCH": "eq",
    "EQUALS_MATCH": "eq",
    "SEQUENCE_LENGTH": "len",
    "LIST_LENGTH": "len",
    "DICT_LENGTH": "len",
    "EMPTY_NN_MODULE_HOOKS_DICT": "len",
    "LENGTH_CHECK": "len",
    "DICT_KEYS": "keys",
    "DICT_KEYS_MATCH": "keys",
    "DUPLICATE_INPUT": "same",
    "DICT_CONTAINS": "contains",
    "DICT_NOT_CONTAINS": "contains",  # torch 2.11 / 2.14 names
}
_SIMPLE = (str, int, float, bool, type(None))
_IMPORT_ALIAS = "__import_"
_BUILTINS_ALIAS = "__builtins_dict___"


class NotDescribable(Exception):
    """A value, guard or source the pack cannot describe the same way in another process: no artifact for it."""


def describe_callable(fn: Any) -> str:
    """Identity-describing text of a callable: ``module.qualname``, a digest of its code and the values of its
    closure cells (``functools.partial``: its function, arguments and keywords; a bound method: its function and a
    describable ``self``).

    Args:
        fn: a function, ``functools.partial``, bound method, builtin or torch operator (``torch.ops.ns.op``, by
            its qualified name: :func:`core.torch_compat.operator_name`).
    Returns:
        the text (equal for the same code with the same captured values, in any process).
    Raises:
        NotDescribable: a captured value or ``self`` that is not a str/int/float/bool/None, a tuple of those, or
            a describable callable; or a callable of another kind (a callable object).
    """
    if isinstance(fn, functools.partial):
        return (
            f"partial({describe_callable(fn.func)}, {describe_value(fn.args)}, "
            f"{describe_value(sorted(fn.keywords.items()))})"
        )
    if isinstance(fn, types.MethodType):
        return f"method({describe_callable(fn.__func__)}, {describe_value(fn.__self__)})"
    if isinstance(fn, types.BuiltinFunctionType | types.BuiltinMethodType):
        return f"builtin {getattr(fn, '__module__', None)}.{fn.__qualname__}"
    if (op := torch_compat.operator_name(fn)) is not None:  # torch.ops.<ns>.<op>: by name, and its Python kernels
        return _describe_operator(op, fn)
    if not isinstance(fn, types.FunctionType):
        raise NotDescribable(f"callable of type {type(fn).__qualname__}")
    cells = [describe_value(c.cell_contents) for c in (fn.__closure__ or ())]
    defaults = describe_value(fn.__defaults__) if fn.__defaults__ else ""
    return (
        f"{portable_module(fn.__module__)}.{fn.__qualname__}#{code_digest(fn.__code__)}({','.join(cells)}){defaults}"
    )


def _describe_operator(op: str, fn: Any) -> str:
    """An operator by its name and the digest of each Python kernel (:func:`core.torch_compat.operator_python_kernels`;
    C++ kernels come with the library that registers them, whose version is in the key). Raises
    :class:`NotDescribable` for a kernel registered through ``torch.library.Library.impl``, whose function the
    dispatcher holds out of reach."""
    functions, opaque = torch_compat.operator_python_kernels(fn)
    if opaque:
        raise NotDescribable(
            f"{op} has Python kernels registered through torch.library.Library.impl ({', '.join(opaque)}): the "
            "pack cannot read which code they run"
        )
    if not functions:
        return op
    kernels = ",".join(
        f"{role}={function_digest(f) if isinstance(f, types.FunctionType) else type(f).__qualname__}"
        for role, f in functions.items()
    )
    return f"{op}{{{kernels}}}"


def describe_value(v: Any) -> str:
    """Portable text of a value compared by identity or equality: simple constants, tuples/lists of them, dtypes,
    devices, enum members, modules, classes and callables. Raises :class:`NotDescribable` for anything else."""
    if isinstance(v, _SIMPLE):
        return f"{type(v).__name__}:{v!r}"
    if type(v) in (tuple, list):
        return type(v).__name__ + "(" + ",".join(describe_value(x) for x in v) + ")"
    if isinstance(v, torch.dtype | torch.device):
        return f"{type(v).__name__}:{v}"
    if isinstance(v, enum.Enum) or _is_bound_enum(v):
        return f"enum {_class_name(type(v))}.{v.name}"
    if isinstance(v, types.ModuleType):
        return f"module {portable_module(v.__name__)}"
    if isinstance(v, type):
        return f"class {_class_name(v)}"
    if v is Ellipsis or v is NotImplemented:
        return repr(v)
    if callable(v):
        return describe_callable(v)
    raise NotDescribable(f"a value of type {type(v).__qualname__}")


def _is_bound_enum(v: Any) -> bool:
    """A C++ enum value bound by pybind11 (``torch.nn.attention._SDPBackend.MATH``): its type lists its members by
    name, and the value is the member of that name."""
    members = getattr(type(v), "__members__", None)
    name = getattr(v, "name", None)
    return isinstance(members, Mapping) and isinstance(name, str) and members.get(name) is v


def _class_name(cls: type) -> str:
    return f"{portable_module(cls.__module__)}.{cls.__qualname__}"


def _describe(kind: str, value: Any) -> str:
    if kind == "is":
        return describe_value(value)
    if kind == "code":
        fn = value
        if not isinstance(fn, types.FunctionType):
            raise NotDescribable(f"CLOSURE_MATCH on a {type(fn).__qualname__}")
        return f"{portable_module(fn.__module__)}.{fn.__qualname__}#{code_digest(fn.__code__)}"
    if kind == "type":
        return f"class {_class_name(type(value))}"
    if kind == "eq":
        if not (
            isinstance(value, _SIMPLE + (tuple, list, torch.dtype, torch.device, enum.Enum)) or _is_bound_enum(value)
        ):
            raise NotDescribable(f"an equality guard on a {type(value).__qualname__}")
        return describe_value(value)
    if kind == "len":
        return str(len(value))
    if kind == "keys":
        return describe_value(list(value.keys()))
    if kind in ("same", "contains"):
        return repr(value is True)
    raise NotDescribable(f"guard kind {kind!r}")


# ------------------------------------------------------------------------------------------ guard sources
class _Globals:
    """``G`` of a guard source: the traced function's globals, with Dynamo's aliases resolved."""

    __slots__ = ("g",)

    def __init__(self, g: Mapping[str, Any]) -> None:
        self.g = g

    def __getitem__(self, name: str) -> Any:
        if name.startswith(_IMPORT_ALIAS):
            module_name = name[len(_IMPORT_ALIAS) :].replace("_dot_", ".")
            module = sys.modules.get(module_name) or local_module(module_name)  # a portable name (carried sources)
            if module is None:
                raise KeyError(name)
            return module
        if name.startswith(_BUILTINS_ALIAS):
            return builtins.__dict__
        return self.g[name]


@functools.lru_cache(maxsize=4096)
def parse_source(source: str) -> tuple:
    """The one reading of a guard source: Dynamo's source name parsed into nested tuples, which both the value reader
    (:func:`read_source`) and the C++ tree builder (:func:`build_tree`) walk.

    Args:
        source: a guard source (``G['F'].linear``, ``self._modules['s'].weight_function[0]``, ``type(x)``,
            ``dict(type(x).__dict__)``, ``a is b``, ``'key' in d``).
    Returns:
        ``("name", id)``, ``("attr", inner, name)``, ``("item", inner, constant)``, ``("type", inner)``,
        ``("is", left, right)`` or ``("in", key, inner)``; ``dict(x)`` reads the mapping as it is, so it is ``x``.
    Raises:
        NotDescribable: a source outside names, attributes, constant subscripts, ``type(...)``, ``dict(...)``,
            ``is`` and ``'key' in`` (nothing is evaluated).
    """
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError as e:
        raise NotDescribable(f"guard source {source!r} is not an expression") from e

    def walk(n: ast.AST) -> tuple:
        if isinstance(n, ast.Name):
            return ("name", n.id)
        if isinstance(n, ast.Attribute):
            return ("attr", walk(n.value), n.attr)
        if isinstance(n, ast.Subscript):
            try:
                index = ast.literal_eval(n.slice)
            except ValueError as e:
                raise NotDescribable(f"guard source {source!r}: a subscript that is not a constant") from e
            return ("item", walk(n.value), index)
        if isinstance(n, ast.Compare) and len(n.ops) == 1 and len(n.comparators) == 1:
            if isinstance(n.ops[0], ast.Is):
                return ("is", walk(n.left), walk(n.comparators[0]))
            if isinstance(n.ops[0], ast.In) and isinstance(n.left, ast.Constant):
                return ("in", n.left.value, walk(n.comparators[0]))
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id in ("type", "dict")
            and len(n.args) == 1
            and not n.keywords
        ):
            inner = walk(n.args[0])
            return inner if n.func.id == "dict" else ("type", inner)  # dict(...): the mapping itself, no copy
        raise NotDescribable(f"guard source {source!r}: {type(n).__name__} is not read by the pack")

    return walk(node)


@functools.lru_cache(maxsize=4096)
def _reader(source: str) -> Callable[[Mapping[str, Any]], Any]:
    """A function reading the guard source ``source`` (:func:`parse_source`) from an environment (the frame's
    arguments by name, and ``G``). Raises :class:`NotDescribable` for a source the pack does not read."""

    def build(p: tuple) -> Callable[[Mapping[str, Any]], Any]:
        op = p[0]
        if op == "name":
            name = p[1]
            return lambda env: env[name]
        if op == "attr":
            inner, attr = build(p[1]), p[2]
            return lambda env: getattr(inner(env), attr)
        if op == "item":
            inner, index = build(p[1]), p[2]
            return lambda env: inner(env)[index]
        if op == "type":
            inner = build(p[1])
            return lambda env: type(inner(env))
        if op == "is":
            left, right = build(p[1]), build(p[2])
            return lambda env: left(env) is right(env)
        key, container = p[1], build(p[2])  # "in"
        return lambda env: key in container(env)

    return build(parse_source(source))


def read_source(source: str, env: Mapping[str, Any]) -> Any:
    """The value of the guard source ``source`` in a call's environment (:class:`Binder`). Raises
    :class:`NotDescribable` for a source the pack does not read, and what reading it raises."""
    return _reader(source)(env)


class Binder:
    """The environment of a block call for guard sources: ``type(module).forward``'s parameters by name (defaults
    filled) and ``G`` (its globals)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        self.positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.names = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        self.varargs = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), None)
        self.varkw = next((p.name for p in params if p.kind == p.VAR_KEYWORD), None)
        self.defaults = {p.name: p.default for p in params if p.default is not p.empty}
        self.globals = _Globals(getattr(fn, "__globals__", {}))

    def __call__(self, module: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        env = dict(self.defaults)
        values = (module, *args)
        env.update(zip(self.positional, values))
        extra = {}
        for k, v in kwargs.items():
            if k in self.names:
                env[k] = v
            else:
                extra[k] = v
        if self.varargs is not None:
            env[self.varargs] = tuple(values[len(self.positional) :])
        if self.varkw is not None:
            env[self.varkw] = extra
        env["G"] = self.globals
        env["L"] = env
        return env


# ------------------------------------------------------------------------------------------ carried guards
@dataclasses.dataclass(frozen=True)
class CarriedGuard:
    """One dropped guard the pack carries: ``source`` (Dynamo's source name), ``kind`` (:data:`GUARD_KINDS`),
    ``guard_type`` (Dynamo's) and ``value`` (the portable text of what it compared, at trace time)."""

    source: str
    kind: str
    guard_type: str
    value: str

    def as_list(self) -> list[str]:
        return [self.source, self.kind, self.guard_type, self.value]

    @classmethod
    def from_list(cls, item: Sequence[str]) -> CarriedGuard:
        return cls(*map(str, item))


_IMPORT_SOURCE = re.compile(r"G\['__import_([^']+)'\]")


def portable_source(source: str) -> str:
    """``source`` with Dynamo's module aliases (``G['__import_<module, "." as "_dot_">']``) named portably
    (:func:`core.compile.warm.traced_code.portable_module`): ComfyUI imports a pack under its absolute folder path, and
    a carried guard on one of the pack's module globals must read the same in a replica installed elsewhere.
    :class:`_Globals` resolves the portable name back to the module loaded here."""

    def rename(m: re.Match[str]) -> str:
        module = portable_module(m.group(1).replace("_dot_", "."))
        return f"G['{_IMPORT_ALIAS}{module.replace('.', '_dot_')}']"

    return _IMPORT_SOURCE.sub(rename, source)


def carry(entries: Sequence[Any], env: Mapping[str, Any]) -> tuple[list[CarriedGuard], list[str]]:
    """The carried guards for the guard entries an artifact dropped.

    Args:
        entries: Dynamo ``GuardFilterEntry`` objects the jit keeps and the artifact cannot (``.name``,
            ``.guard_type``, ``.value``, ``.has_value``).
        env: the traced call's environment (:class:`Binder`), to check that each source reads back the value the
            guard saw.
    Returns:
        ``(guards, problems)``: one :class:`CarriedGuard` per entry the pack can carry (sorted, no repeats), and one
        text per entry it cannot (a guard type it does not carry, a source it cannot read or that reads another
        object than Dynamo guarded, a value it cannot describe). The artifact may be used only when ``problems`` is
        empty.
    """
    out, problems = set(), []
    for e in entries:
        gtype, name = str(getattr(e, "guard_type", "")), portable_source(str(getattr(e, "name", "")))
        try:
            out.add(_carry_one(e, gtype, name, env))
        except NotDescribable as ex:
            problems.append(str(ex))
    return sorted(out, key=lambda g: (g.source, g.kind)), problems


def _read_back(source: str, gtype: str, name: str, env: Mapping[str, Any]) -> Any:
    """The value of a guard source in the traced call's environment; :class:`NotDescribable` naming the guard when
    the source cannot be read."""
    try:
        return _reader(source)(env)
    except NotDescribable:
        raise
    except Exception as ex:
        raise NotDescribable(
            f"guard {gtype} on {name}: the source does not read back ({type(ex).__name__}: {ex})"
        ) from ex


def _carry_one(e: Any, gtype: str, name: str, env: Mapping[str, Any]) -> CarriedGuard:
    kind = GUARD_KINDS.get(gtype)
    if kind is None:
        raise NotDescribable(f"guard {gtype} on {name or '(no source)'} cannot be carried")
    if kind == "same":
        other = torch_compat.duplicate_source(e)
        if other is None:
            raise NotDescribable(f"guard {gtype} on {name}: its other source is not known")
        other = portable_source(other)
        if _read_back(name, gtype, name, env) is not _read_back(other, gtype, name, env):
            raise NotDescribable(f"guard {gtype} on {name}: the sources read two objects")
        return CarriedGuard(f"{name} is {other}", kind, gtype, "True")
    if kind == "contains":
        key = torch_compat.guard_arguments(e).get("key")
        if not isinstance(key, str):
            raise NotDescribable(f"guard {gtype} on {name}: its key is not known")
        source = f"{key!r} in {name}"
        return CarriedGuard(source, kind, gtype, repr(bool(_read_back(source, gtype, name, env))))
    value = _read_back(name, gtype, name, env)
    if getattr(e, "has_value", False) and value is not e.value and not (kind == "eq" and value == e.value):
        raise NotDescribable(f"guard {gtype} on {name}: the source reads another object than Dynamo guarded")
    try:
        return CarriedGuard(name, kind, gtype, _describe(kind, value))
    except NotDescribable as ex:
        raise NotDescribable(f"guard {gtype} on {name}: {ex}") from ex


@dataclasses.dataclass
class Matched:
    """Carried guards found to hold in this process, with the objects they matched (:attr:`seen`, what :func:`_now`
    gives). Per call the route checks them as leaves of a C++ guard tree (:func:`build_tree`); :meth:`still` is the
    same check read in Python, for a torch without those guards."""

    guards: tuple[CarriedGuard, ...]
    readers: tuple[Callable[[Mapping[str, Any]], Any], ...]
    seen: tuple[Any, ...]

    def still(self, env: Mapping[str, Any]) -> bool:
        """Whether every guard still reads what it matched (False when a source fails to read): identity for
        ``is``, ``code`` and ``type``, equality for the other kinds."""
        try:
            for g, read, seen in zip(self.guards, self.readers, self.seen):
                now = _now(g.kind, read(env))
                if (now != seen) if g.kind in _BY_EQUALITY else (now is not seen):
                    return False
        except Exception:  # noqa: BLE001 (a source that no longer reads: the guard does not hold)
            return False
        return True


_BY_EQUALITY = frozenset(("eq", "len", "keys", "same", "contains"))


def _now(kind: str, value: Any) -> Any:
    """What :meth:`Matched.still` compares for a guard of ``kind`` (identity for is/code/type)."""
    if kind == "code":
        return value.__code__
    if kind == "type":
        return type(value)
    if kind == "len":
        return len(value)
    if kind == "keys":
        return tuple(value.keys())
    if kind == "eq":
        return (type(value), value)
    return value


def match(guards: Sequence[CarriedGuard], env: Mapping[str, Any]) -> tuple[Matched | None, str | None]:
    """Whether the carried ``guards`` hold in ``env`` (describe each value now and compare with the saved text).

    Args:
        guards: from the artifact's record.
        env: the call's environment (:class:`Binder`).
    Returns:
        ``(Matched, None)`` when all hold; ``(None, reason)`` naming the first that does not.
    """
    readers, seen = [], []
    for g in guards:
        try:
            read = _reader(g.source)
            value = read(env)
            now = _describe(g.kind, value)
        except Exception as e:  # noqa: BLE001 (NotDescribable, or a source that no longer reads)
            return None, f"{g.guard_type} on {g.source}: {type(e).__name__}: {e}"
        if now != g.value:
            return None, f"{g.guard_type} on {g.source} is {now}, precompiled for {g.value}"
        readers.append(read)
        seen.append(_now(g.kind, value))
    return Matched(tuple(guards), tuple(readers), tuple(seen)), None


def build_tree(
    tree: Any, matched: Matched, env: Mapping[str, Any], pinned_code: Mapping[tuple[int, str], Any] | None = None
) -> None:
    """Add the carried guards of ``matched`` to ``tree`` (:class:`core.torch_compat.GuardTree`), as C++ leaves where
    torch has one: each guard's source becomes a chain of accessors from the call's locals (``L``, a name), the
    block's module globals (``G``) or a module (``G['__import_<module>']``), sharing prefixes; its kind a leaf
    comparing with what it matched (:attr:`Matched.seen`: identity, type, equality, length); ``a is b`` becomes
    identity with the one object both sides read when they matched (stricter: both must stay that object); the
    membership of ``'k' in d`` and ordered keys stay Python tests on the value the C++ accessors read.

    A class that a carried type guard pins (``type(S) is C``, a leaf of this tree) is read as the constant ``C``
    wherever a source reads ``type(S)`` (:func:`_pinned_classes`), and equal checks are built once: the memberships,
    constants and method code that Dynamo guards through ``type(S).__mro__[i]`` of each submodule of one class
    become one check of that class (the tree still reads ``C.__mro__[i]`` on every call). Sound because every leaf
    of the tree must pass: while ``type(S) is C`` holds, ``type(S)`` and ``C`` read the same.

    Args:
        tree: the builder, whose root's value is the call's environment (:class:`Binder`).
        matched: guards found to hold, with the objects they matched (kept alive by ``matched``).
        env: the environment they matched in (example values for the accessors).
        pinned_code: ``{(id(module dict), name): code}`` of module-level functions whose object and ``__code__``
            the same tree already pins (:meth:`core.compile.warm.traced_code.CodeIdentity.module_functions`): a
            carried guard that such an entry (``G['name']`` of the block's module, ``G['__import_m'].name``) holds
            that very code is not built twice.
    Raises:
        NotDescribable: a source the pack does not read; ``TypeError`` / ``RuntimeError`` / ``KeyError`` /
            ``AttributeError``: torch cannot build an accessor or a leaf here (keep the Python checks).
    """
    globals_ = env["G"]
    memo: dict[tuple, tuple[Any, Any]] = {}  # parsed source -> (manager, example value): shared prefixes once
    pinned = _pinned_classes(matched)
    classes = {id(c): c for c in pinned.values()}
    built: set[tuple] = set()  # (kind, canonical source, what it compares with): each check once

    def node(p: tuple, source: str) -> tuple[Any, Any]:
        if p in memo:
            return memo[p]
        op = p[0]
        if op == "class":  # type(S) of a pinned S: the class itself, a constant
            cls = classes[p[1]]
            return memo.setdefault(p, (tree.constant(cls, p[2]), cls))
        if op == "name" and p[1] == "L":
            return tree.frame(env), env
        if op == "name" and p[1] == "G":
            got = (tree.constant(globals_.g, "G"), globals_.g)
        elif op == "name":
            got = (tree.item(tree.frame(env), p[1], f"L[{p[1]!r}]", env[p[1]]), env[p[1]])
        elif op == "attr" and p[2] == "__dict__" and isinstance(node(p[1], source)[1], type):
            parent, value = node(p[1], source)  # a class's own dict, as the dict it is (torch's dict leaves)
            got = (tree.class_dict(parent, _text(p), value.__dict__), value.__dict__)
        elif op == "attr":
            parent, value = node(p[1], source)
            attr = getattr(value, p[2])
            got = (tree.attr(parent, p[2], _text(p), attr), attr)
        elif op == "item" and p[1] == ("name", "G") and str(p[2]).startswith((_IMPORT_ALIAS, _BUILTINS_ALIAS)):
            module = globals_[p[2]]  # Dynamo's alias of a module (or builtins): the object itself
            got = (tree.constant(module, _text(p)), module)
        elif op == "item":
            parent, value = node(p[1], source)
            item = value[p[2]]
            got = (tree.item(parent, p[2], _text(p), item), item)
        elif op == "type":
            parent, value = node(p[1], source)
            got = (tree.type_of(parent, _text(p), type(value)), type(value))
        else:
            raise NotDescribable(f"guard source {source!r}: {op!r} is not built into the guard tree")
        memo[p] = got
        return got

    for g, seen in zip(matched.guards, matched.seen):
        parts = f"{g.guard_type} on {g.source} (carried by the pack)"
        p = _canonical(parse_source(g.source), pinned)
        once = (g.kind, p, id(seen) if g.kind in ("is", "code", "type", "same") else repr(seen))
        if once in built or (g.kind == "code" and pinned_code and pinned_code.get(_entry_of(p, globals_)) is seen):
            continue
        built.add(once)
        if g.kind == "same":  # "a is b": each side is the object both read when they matched (kept alive)
            if p[0] != "is":
                raise NotDescribable(f"guard source {g.source!r} is not a comparison")
            for side in (p[1], p[2]):
                manager, value = node(side, g.source)
                tree.keep(value)
                tree.is_(manager, value, parts)
            continue
        if g.kind == "contains":  # "'k' in d": a C++ leaf on a dict, else a Python test on what C++ reads
            if p[0] != "in":
                raise NotDescribable(f"guard source {g.source!r} is not a membership")
            manager, container = node(p[2], g.source)
            if type(container) is dict:  # a C++ leaf (a class's __dict__ read by class_dict, an instance's)
                tree.contains(manager, p[1], seen, parts)
            else:
                tree.holds(manager, lambda d, key=p[1], seen=seen: (key in d) == seen, parts)
            continue
        manager, value = node(p, g.source)
        if g.kind == "is":
            tree.is_(manager, seen, parts)
        elif g.kind == "code":
            code = tree.attr(manager, "__code__", f"{g.source}.__code__", value.__code__)
            tree.is_(code, seen, parts)
        elif g.kind == "type":
            tree.type_is(manager, seen, parts)
        elif g.kind == "eq":  # torch's EQUALS_MATCH compares the value's exact type first (as seen[0] does)
            tree.equals(manager, seen[1], parts)
        elif g.kind == "len":
            tree.length(manager, seen, value, parts)
        elif g.kind == "keys":
            tree.holds(manager, lambda v, seen=seen: tuple(v.keys()) == seen, parts)
        else:
            raise NotDescribable(f"guard kind {g.kind!r} is not built into the guard tree")


def _entry_of(p: tuple, globals_: _Globals) -> tuple[int, str] | None:
    """``(id(module dict), name)`` when ``p`` reads a module-level entry: ``G['name']`` (the block's globals) or
    ``G['__import_m'].name`` (Dynamo's alias of module ``m``); else None."""
    if p[0] == "item" and p[1] == ("name", "G") and isinstance(p[2], str) and not p[2].startswith("__"):
        return id(globals_.g), p[2]
    if p[0] == "attr" and p[1][0] == "item" and p[1][1] == ("name", "G") and str(p[1][2]).startswith(_IMPORT_ALIAS):
        try:
            return id(vars(globals_[p[1][2]])), p[2]
        except (KeyError, TypeError):
            return None
    return None


def _pinned_classes(matched: Matched) -> dict[tuple, type]:
    """``{parsed source S: C}`` for each carried type guard ``type(S) is C`` (:func:`parse_source`'s form)."""
    return {
        parse_source(g.source): seen
        for g, seen in zip(matched.guards, matched.seen)
        if g.kind == "type" and isinstance(seen, type)
    }


def _canonical(p: tuple, pinned: Mapping[tuple, type]) -> tuple:
    """``p`` with each ``("type", S)`` of a pinned ``S`` replaced by ``("class", id(C), "module.qualname")``, C the
    class the type guard pins (:func:`build_tree`): sources through one class then share their accessors and
    leaves."""
    op = p[0]
    if op == "type" and p[1] in pinned:
        cls = pinned[p[1]]
        return ("class", id(cls), f"{cls.__module__}.{cls.__qualname__}")
    if op == "name":
        return p
    if op in ("attr", "item"):
        return (op, _canonical(p[1], pinned), p[2])
    if op == "type":
        return (op, _canonical(p[1], pinned))
    if op == "is":
        return (op, _canonical(p[1], pinned), _canonical(p[2], pinned))
    return (op, p[1], _canonical(p[2], pinned))  # "in"


def _text(p: tuple) -> str:
    """A parsed source (:func:`parse_source`) as text again: the name of its manager in the tree."""
    op = p[0]
    if op == "name":
        return p[1] if p[1] in ("G", "L") else f"L[{p[1]!r}]"
    if op == "class":
        return p[2]
    if op == "attr":
        return f"{_text(p[1])}.{p[2]}"
    if op == "item":
        return f"{_text(p[1])}[{p[2]!r}]"
    if op == "type":
        return f"type({_text(p[1])})"
    if op == "is":
        return f"({_text(p[1])} is {_text(p[2])})"
    return f"({p[1]!r} in {_text(p[2])})"
