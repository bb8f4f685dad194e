"""The identity of a precompiled variant from the code its trace ran (``core.compile.warm.traced_code``, issue 45)."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from steadfast.core import torch_compat
from steadfast.core.compile.warm import carried_guards, traced_code


def _module(name: str, source: str) -> types.ModuleType:
    """Module ``name`` (as ComfyUI names a pack it loads from a folder) made from ``source``, imported from a file."""
    f = Path(tempfile.mkdtemp(prefix="sf-traced-")) / "mod.py"
    f.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


HELPER = """
def helper(x, scale=1.0):
    return x * scale
"""


def test_module_names_are_portable_across_install_folders():
    """ComfyUI imports a custom node pack under its absolute folder path; the same code in two folders describes
    the same way, and the name maps back to the module loaded here."""
    a = _module("/srv/a/custom_nodes/SomePack_x_v2.helpers", HELPER)
    b = _module("/opt/b/custom_nodes/SomePack_x_v2.helpers", HELPER)
    try:
        assert traced_code.portable_module(a.__name__) == "custom_nodes/SomePack_x_v2.helpers"
        assert traced_code.portable_module(b.__name__) == traced_code.portable_module(a.__name__)
        assert carried_guards.describe_callable(a.helper) == carried_guards.describe_callable(b.helper)
        assert traced_code.function_digest(a.helper) == traced_code.function_digest(b.helper)
        assert traced_code.portable_module(traced_code.__name__) == "steadfast.core.compile.warm.traced_code"
        assert traced_code.local_module("steadfast.core.compile.warm.traced_code") is traced_code
        assert traced_code.portable_module("comfy.ldm.modules.attention") == "comfy.ldm.modules.attention"
    finally:
        del sys.modules[a.__name__], sys.modules[b.__name__]


def test_the_function_digest_sees_code_defaults_and_closure_values():
    mod = _module("sf_traced_code_digest", HELPER)
    try:
        first = traced_code.function_digest(mod.helper)
        mod.helper.__defaults__ = (2.0,)  # Dynamo guards no constant default
        assert traced_code.function_digest(mod.helper) != first
        mod.helper.__defaults__ = (1.0,)
        assert traced_code.function_digest(mod.helper) == first

        def make(v):
            def inner(x):
                return x * v

            return inner

        assert traced_code.function_digest(make(1)) != traced_code.function_digest(make(2))
        assert traced_code.function_digest(make(1)) == traced_code.function_digest(make(1))
    finally:
        del sys.modules[mod.__name__]


class Inner(nn.Module):
    def forward(self, x):
        return torch.relu(x)


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x) + 1


def test_identify_resolve_and_the_per_call_identity(monkeypatch):
    """Paths through the block's classes: a patched submodule class method resolves to other code (every path that
    differs is named), and a code identity matched before sees the patch on its next check."""
    block = Outer()
    codes = [Outer.forward.__code__, Inner.forward.__code__]
    paths, problems = traced_code.identify(block, codes)
    assert problems == [] and set(paths) == {
        f"method {__name__}:Outer.forward",
        f"method {__name__}:Inner.forward",
    }
    identity, problems = traced_code.resolve(paths)
    assert identity is not None and problems == [] and identity.still()
    tree = torch_compat.GuardTree()  # the same check as C++ identity guards
    traced_code.build_tree(tree, identity)
    assert tree.leaves == 3 * len(paths) and tree.check({})  # no keyword-only parameter: no __kwdefaults__ leaf

    def patched(self, x):
        return torch.relu(x) * 2

    original = Inner.__dict__["forward"]
    monkeypatch.setattr(Inner, "forward", patched)
    assert not identity.still() and not tree.check({})
    assert "Inner.forward is the traced code" in tree.failure({})
    monkeypatch.setattr(Inner, "forward", original)
    assert identity.still() and tree.check({})
    monkeypatch.setattr(Outer.forward, "__defaults__", (1,))  # the same function object, other defaults
    assert not identity.still() and not tree.check({})
    monkeypatch.undo()
    assert identity.still() and tree.check({})
    monkeypatch.setattr(Inner, "forward", patched)
    again, problems = traced_code.resolve(paths)
    assert again is None and len(problems) == 1 and "Inner.forward runs other code" in problems[0]
    monkeypatch.undo()
    assert traced_code.resolve(paths)[0] is not None
    assert traced_code.resolve({"method nowhere.at.all:Thing.forward": "0" * 16})[1] == [
        "method nowhere.at.all:Thing.forward: module nowhere.at.all is not loaded"
    ]


class Scaled(nn.Module):
    def forward(self, x, *, scale=1.0):
        return x * scale


def test_keyword_defaults_are_checked_where_the_code_reads_them(monkeypatch):
    """A function's ``__kwdefaults__`` fill only its keyword-only parameters: changed on a ``forward`` with one, the
    output changes and the identity fails; set on one without (the same code object), the output is the same bytes
    and the identity still holds, so that leaf is not built."""
    x = torch.randn(3)
    paths = {f"method {__name__}:Scaled.forward": traced_code.function_digest(Scaled.forward)}
    paths[f"method {__name__}:Inner.forward"] = traced_code.function_digest(Inner.forward)
    identity, problems = traced_code.resolve(paths)
    assert identity is not None and problems == []
    tree = torch_compat.GuardTree()
    traced_code.build_tree(tree, identity)
    assert tree.leaves == 4 + 3 and tree.check({})
    before = (Scaled()(x), Inner()(x))
    monkeypatch.setattr(Inner.forward, "__kwdefaults__", {"scale": 2.0})  # no keyword-only parameter reads it
    assert torch.equal(Inner()(x), before[1]) and identity.still() and tree.check({})
    monkeypatch.setattr(Scaled.forward, "__kwdefaults__", {"scale": 2.0})
    assert not torch.equal(Scaled()(x), before[0])  # the case is not vacuous: it changes the output
    assert not identity.still() and not tree.check({}) and "keyword defaults" in tree.failure({})


def test_a_nested_function_nobody_covers_is_a_problem():
    def local_helper(x):
        return x

    block = Outer()
    _, problems = traced_code.identify(block, [Outer.forward.__code__, local_helper.__code__])
    assert len(problems) == 1 and "nested function" in problems[0]
    described = f"#{traced_code.code_digest(local_helper.__code__)}"  # a guard or the key describes it
    assert traced_code.identify(block, [Outer.forward.__code__, local_helper.__code__], described)[1] == []


@pytest.mark.parametrize("kind", ["class in a function"])
def test_a_class_another_process_cannot_find_is_refused(kind):
    class Local(nn.Module):
        def forward(self, x):
            return x

    paths, problems = traced_code.identify(Local(), [Local.forward.__code__])
    assert paths == {} and len(problems) == 1 and "another process could not find it" in problems[0], kind


def test_nested_code_is_covered_by_its_parent_in_any_order():
    """ComfyUI's ``attention_pytorch`` is wrapped (``wrap_attn``: the module attribute is the wrapper) and holds
    lambdas; the trace lists the lambdas before their parent. The parent, described by a carried guard (the wrapper's
    closure cell), covers them: no problem, whatever the order."""

    def parent(x):
        return sorted(x, key=lambda v: -v)

    lam = next(c for c in parent.__code__.co_consts if isinstance(c, types.CodeType))
    described = f"#{traced_code.code_digest(parent.__code__)}"
    for order in ([lam, parent.__code__], [parent.__code__, lam]):
        paths, problems = traced_code.identify(Outer(), [Outer.forward.__code__, *order], described)
        assert problems == [] and list(paths) == [f"method {__name__}:Outer.forward"], order
    assert len(traced_code.identify(Outer(), [Outer.forward.__code__, lam])[1]) == 1  # nobody covers it


def test_carried_guard_sources_on_a_pack_module_are_portable():
    """A carried guard on a module global of a pack reads ``G['__import_<module>']``, Dynamo's alias named after the
    module, which ComfyUI names by the pack's absolute folder (issue 45 item 5: a replica elsewhere could not read
    it, and refused). The source is kept under the portable name and resolves to the module loaded here; a pybind
    enum value (the SDPA backend a pack's override picks) is described by its member name."""
    mod = _module("/srv/x/custom_nodes/SomePack.attention_sf", "BACKEND = 3\n")
    try:
        source = "G['__import_/srv/x/custom_nodes/SomePack_dot_attention_sf'].BACKEND"
        portable = carried_guards.portable_source(source)
        assert portable == "G['__import_custom_nodes/SomePack_dot_attention_sf'].BACKEND"
        env = carried_guards.Binder(Outer.forward)(Outer(), (torch.ones(1),), {})
        assert carried_guards.read_source(portable, env) == 3
    finally:
        del sys.modules[mod.__name__]
    math = torch.nn.attention.SDPBackend.MATH
    assert carried_guards.describe_value(math) == f"enum {type(math).__module__}.{type(math).__qualname__}.MATH"


def test_the_call_key_does_not_depend_on_the_install_folder():
    """ComfyUI puts the pack's own functions and objects into ``transformer_options`` (wrappers, callbacks); named by
    the module ComfyUI imported the pack under, its absolute folder, they gave a replica elsewhere other keys (its
    artifacts missed). The same code in two folders gives one key."""
    from steadfast.core.compile.options import CompileOptions
    from steadfast.core.compile.warm import call_key as ck

    source = "def wrapper(x):\n    return x\n\nclass Holder:\n    pass\n"
    a = _module("/srv/a/custom_nodes/ComfyUI-Pack_sf.wrappers", source)
    b = _module("/opt/b/custom_nodes/ComfyUI-Pack_sf.wrappers", source)
    try:
        block = Outer()
        fp, static = ck.block_fingerprint(block), ck.static_fields(CompileOptions())
        x = torch.ones(2)

        def digest(mod):
            options = {"wrappers": {"w": [mod.wrapper]}, "holder": mod.Holder(), "optimized_attention_override": None}
            key = ck.call_key(fp, static, (x,), {"transformer_options": options}, flags="flags")
            return ck.key_digest(fp, static, key)

        assert digest(a) == digest(b)
    finally:
        del sys.modules[a.__name__], sys.modules[b.__name__]


def test_a_duplicate_input_guard_names_both_sources_portably(monkeypatch):
    """``DUPLICATE_INPUT`` carries "<source> is <other source>"; the other source came from Dynamo unchanged, so a
    pack module's alias in it kept the install folder (the replica server test found it)."""
    mod = _module("/srv/y/custom_nodes/SomePack.dup_sf", "import math\nM = math\n")
    try:
        alias = "G['__import_/srv/y/custom_nodes/SomePack_dot_dup_sf']"
        entry = types.SimpleNamespace(name=f"{alias}.M", guard_type="DUPLICATE_INPUT", value=None, has_value=False)
        monkeypatch.setattr(carried_guards.torch_compat, "duplicate_source", lambda e: "G['__import_math']")
        env = carried_guards.Binder(Outer.forward)(Outer(), (torch.ones(1),), {})
        guards, problems = carried_guards.carry([entry], env)
        assert problems == [] and "/srv/" not in guards[0].source, guards
        monkeypatch.setattr(carried_guards.torch_compat, "duplicate_source", lambda e: f"{alias}.M")
        entry.name = "G['__import_math']"
        guards, problems = carried_guards.carry([entry], env)
        assert problems == [] and "/srv/" not in guards[0].source, guards
    finally:
        del sys.modules[mod.__name__]


def test_a_portable_name_finds_a_module_loaded_after_another_left():
    """A module leaving and another arriving keep ``len(sys.modules)``; the portable-name table was keyed on that
    count and answered "not loaded" for the newcomer (CI row 1 failed on it when the suite ran in full)."""
    from steadfast.core.compile.warm import traced_code

    first = _module("/srv/p/custom_nodes/FirstPack_sf.mod", "X = 1\n")
    assert traced_code.local_module("custom_nodes/FirstPack_sf.mod") is first
    del sys.modules[first.__name__]
    second = _module("/srv/q/custom_nodes/SecondPack_sf.mod", "X = 2\n")
    try:
        assert traced_code.local_module("custom_nodes/SecondPack_sf.mod") is second
        assert traced_code.local_module("custom_nodes/FirstPack_sf.mod") is None
    finally:
        del sys.modules[second.__name__]
