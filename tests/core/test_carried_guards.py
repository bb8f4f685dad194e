"""The guards a precompiled artifact cannot carry, carried by the pack (core/compile/warm/carried_guards.py): described
the same way in any process, read back without eval, and re-checked by identity or value."""

from __future__ import annotations

import types

import pytest
import torch

from steadfast.core import torch_compat
from steadfast.core.compile.warm import carried_guards as cg

SCALE = 1.0


def attention(q):
    return q


def other_attention(q):
    return q * 2


def make(factor):
    def f(x):
        return x * factor

    return f


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.act = make(0.5)

    def forward(self, x, transformer_options={}):  # noqa: B006
        return self.act(self.lin(x)) * SCALE


def entry(name, guard_type, value):
    return types.SimpleNamespace(name=name, guard_type=guard_type, value=value, has_value=True)


def test_guards_are_carried_matched_and_rechecked_by_identity_and_value(monkeypatch) -> None:
    block = Block()
    binder = cg.Binder(Block.forward)
    env = binder(block, (torch.ones(2),), {})
    entries = [
        entry("G['attention']", "CLOSURE_MATCH", attention),
        entry("G['SCALE']", "CONSTANT_MATCH", SCALE),
        entry("self.act", "CLOSURE_MATCH", block.act),
        entry("self.act.__closure__[0].cell_contents", "CONSTANT_MATCH", 0.5),
        entry("type(self._modules['lin'])", "ID_MATCH", torch.nn.Linear),
        entry(f"G['__import_{__name__.replace('.', '_dot_')}'].attention", "FUNCTION_MATCH", attention),
    ]
    guards, problems = cg.carry(entries, env)
    assert problems == [] and len(guards) == len(entries)
    assert {g.value for g in guards} >= {"float:1.0", "float:0.5", "class torch.nn.modules.linear.Linear"}
    matched, why = cg.match(guards, env)
    assert matched is not None and why is None and matched.still(env)

    block.act = make(0.75)  # the same code, another captured value
    assert not matched.still(binder(block, (torch.ones(2),), {}))
    again, why = cg.match(guards, binder(block, (torch.ones(2),), {}))
    assert again is None and "cell_contents" in why and "float:0.75" in why and "float:0.5" in why
    block.act = make(0.5)
    monkeypatch.setitem(globals(), "attention", other_attention)  # a module global rebound (a CLI flag's pick)
    env2 = binder(block, (torch.ones(2),), {})
    assert not matched.still(env2)
    assert "other_attention" in cg.match(guards, env2)[1]


def test_what_cannot_be_described_is_named_not_guessed() -> None:
    block = Block()
    env = cg.Binder(Block.forward)(block, (torch.ones(2),), {})
    block.act = make(torch.ones(1))  # a captured tensor: no portable description
    env = cg.Binder(Block.forward)(block, (torch.ones(2),), {})
    _, problems = cg.carry(
        [
            entry("self.act", "FUNCTION_MATCH", block.act),
            entry("self.lin", "DICT_VERSION", block.lin),
            entry("___odict_getitem(self._modules, 'lin')", "ID_MATCH", block.lin),
        ],
        env,
    )
    assert len(problems) == 3
    assert "self.act" in problems[0] and "Tensor" in problems[0]
    assert "DICT_VERSION" in problems[1] and "cannot be carried" in problems[1]
    assert "not read by the pack" in problems[2]
    with pytest.raises(cg.NotDescribable):
        cg.describe_value(object())


def test_descriptions_do_not_depend_on_the_process() -> None:
    assert cg.describe_callable(make(2.0)) == cg.describe_callable(make(2.0))
    assert cg.describe_callable(make(2.0)) != cg.describe_callable(make(3.0))
    assert cg.describe_value(torch.float16) == "dtype:torch.float16"
    assert cg.describe_value(torch) == "module torch" and "0x" not in cg.describe_callable(attention)


def test_torch_operators_are_carried_by_their_qualified_name() -> None:
    """A trace that calls ``torch.ops.<namespace>.<op>`` gets a BUILTIN_MATCH guard on the packet (ComfyUI 0.33's
    Flux: ``torch.ops.comfy_kitchen.apply_rope``). Before, ``describe_callable`` refused it ("callable of type
    OpOverloadPacket") and every Flux block ran the jit; now it is carried by the operator's qualified name and
    re-checked by identity."""
    assert cg.describe_callable(torch.ops.aten.sin) == "op aten::sin"
    assert cg.describe_callable(torch.ops.aten.add.Tensor) == "op aten::add.Tensor"
    assert cg.describe_value(torch.ops.aten.sin) != cg.describe_value(torch.ops.aten.cos)
    block = Block()
    binder = cg.Binder(Block.forward)
    env = binder(block, (torch.ones(2),), {})
    guards, problems = cg.carry([entry("G['torch'].ops.aten.sin", "BUILTIN_MATCH", torch.ops.aten.sin)], env)
    assert problems == [] and guards[0].value == "op aten::sin"
    matched, why = cg.match(guards, env)
    assert matched is not None and matched.still(env), why


def test_custom_operators_are_described_by_their_python_kernels() -> None:
    """issue 45: a ``torch.library`` operator was carried by its name only, so a process whose Python kernel differs
    answered with the other kernel's graph. A ``custom_op`` is described by the digest of each of its Python kernels
    (another kernel body gives another text); a Python kernel registered through ``Library.impl``, whose function
    the dispatcher holds out of reach, is refused (no artifact) instead of carried by name."""
    torch_compat.import_compile_stack()  # torch 2.11: inductor imported after a new custom_op fails on its decomps

    def define(ns: str, scale: float):
        @torch.library.custom_op(f"{ns}::scaled", mutates_args=())
        def scaled(x: torch.Tensor) -> torch.Tensor:
            return x * scale

        return getattr(torch.ops, ns).scaled

    one, other, same = define("sfcg_a", 2.0), define("sfcg_b", 3.0), define("sfcg_c", 2.0)
    text = cg.describe_callable(one)
    assert text.startswith("op sfcg_a::scaled{") and "init=" in text
    body = text.split("{", 1)[1]
    assert body == cg.describe_callable(same).split("{", 1)[1]  # the same kernel code and captured value
    assert body != cg.describe_callable(other).split("{", 1)[1]  # another captured value
    lib = torch.library.Library("sfcg_impl", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
    with pytest.raises(cg.NotDescribable, match="Library.impl .CompositeImplicitAutograd."):
        cg.describe_callable(torch.ops.sfcg_impl.twice)
    assert cg.describe_callable(torch.ops.aten.sin) == "op aten::sin"  # torch's own Meta kernels: shapes only


def _interpreted_still(matched: cg.Matched, env) -> bool:
    """The re-check as the source interpreter (cg._reader) reads it, guard by guard: the reference."""
    try:
        for g, seen in zip(matched.guards, matched.seen):
            now = cg._now(g.kind, cg._reader(g.source)(env))
            if (now != seen) if g.kind in ("eq", "len", "keys", "same", "contains") else (now is not seen):
                return False
    except Exception:  # noqa: BLE001
        return False
    return True


def test_the_generated_check_agrees_with_the_interpreter_for_every_kind(monkeypatch) -> None:
    """Matched.still (the Python re-check) gives on every change below what the guard-by-guard reference gives, and so
    does the tree of C++ guards built from the same parsed sources (``build_tree``); a source outside the node types
    the one parser reads is refused before anything is evaluated."""
    block = Block()
    block.names = ["a", "b"]
    block.table = {"x": 1, "y": 2}
    binder = cg.Binder(Block.forward)
    entries = [
        entry("G['attention']", "CLOSURE_MATCH", attention),
        entry("G['SCALE']", "CONSTANT_MATCH", SCALE),
        entry("self.act", "CLOSURE_MATCH", block.act),
        entry("self.act.__closure__[0].cell_contents", "CONSTANT_MATCH", 0.5),
        entry("type(self._modules['lin'])", "ID_MATCH", torch.nn.Linear),
        entry("self._modules['lin']", "TYPE_MATCH", block.lin),
        entry("self.names", "LIST_LENGTH", block.names),
        entry("self.table", "DICT_KEYS_MATCH", block.table),
    ]
    contains = types.SimpleNamespace(
        name="dict(type(self._modules['lin']).__dict__)", guard_type="DICT_CONTAINS", value=None, has_value=False
    )
    absent = types.SimpleNamespace(  # a class attribute an instance might shadow, absent at trace time
        name="dict(type(self).__dict__)", guard_type="DICT_CONTAINS", value=None, has_value=False, key="extra"
    )
    monkeypatch.setattr(cg.torch_compat, "guard_arguments", lambda e: {"key": getattr(e, "key", "forward")})
    guards, problems = cg.carry([*entries, contains, absent], binder(block, (torch.ones(2),), {}))
    assert problems == [] and {g.kind for g in guards} >= {"code", "eq", "is", "type", "len", "keys", "contains"}
    matched, why = cg.match(guards, binder(block, (torch.ones(2),), {}))
    assert matched is not None, why

    def env():
        return binder(block, (torch.ones(2),), {})

    changes = [
        lambda: None,
        lambda: setattr(block, "act", make(0.75)),
        lambda: setattr(block, "act", make(0.5)),
        lambda: block.names.append("c"),
        lambda: block.names.pop(),
        lambda: block.table.update(z=3),
        lambda: block.table.pop("z"),
        lambda: setattr(Block, "extra", 1),  # the class gains the attribute: the membership guard fails
        lambda: delattr(Block, "extra"),
        lambda: setattr(block, "lin", torch.nn.Linear(2, 2)),
        lambda: delattr(block, "table"),
    ]
    tree = torch_compat.GuardTree()  # the same checks as C++ guards (issue 45): they must agree too
    cg.build_tree(tree, matched, env())
    assert tree.leaves >= len(guards) and tree.check(env())
    results = []
    for change in changes:
        change()
        results.append((matched.still(env()), _interpreted_still(matched, env()), tree.check(env())))
    assert all(got == ref == in_tree for got, ref, in_tree in results), results
    assert [got for got, _, _ in results].count(True) >= 1 and [got for got, _, _ in results].count(False) >= 3
    with pytest.raises(cg.NotDescribable):
        cg.parse_source("__import__('os').getcwd()")
    with pytest.raises(cg.NotDescribable):
        cg.parse_source("self.x[G['k']]")


class CastBase(torch.nn.Module):
    cast_mode = 1


class CastMid(CastBase):
    pass


class CastLinear(CastMid):  # comfy.ops-style: a layer class whose MRO Dynamo guards attribute by attribute
    def forward(self, x):
        return x * self.cast_mode


class CastShadow(CastLinear):
    comfy_cast_weights = True


class Pair(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = CastLinear(), CastLinear()

    def forward(self, x, transformer_options={}):  # noqa: B006
        return self.a(x) + self.b(x)


def test_checks_through_a_pinned_class_are_built_once_and_still_fail(monkeypatch) -> None:
    """Issue 45, per-call cost: the memberships, constants and method code Dynamo guards through
    ``type(S).__mro__[i]`` of each submodule are built once per class when a carried type guard pins that class (two
    submodules of one class: their four MRO checks become two leaves), and the tree still fails on every change the
    guard-by-guard reference fails on: a submodule of another class (its type leaf), a base class gaining the
    attribute (the membership, read through ``C.__mro__`` on every call), a class constant changed."""
    pair = Pair()
    binder = cg.Binder(Pair.forward)
    entries, mro = [], "type(self._modules[{!r}]).__mro__"
    for name in ("a", "b"):
        entries += [
            entry(f"self._modules[{name!r}]", "TYPE_MATCH", getattr(pair, name)),
            types.SimpleNamespace(
                name=f"dict({mro.format(name)}[1].__dict__)", guard_type="DICT_CONTAINS", value=None, has_value=False
            ),
            entry(f"dict({mro.format(name)}[2].__dict__)['cast_mode']", "CONSTANT_MATCH", 1),
            entry(f"{mro.format(name)}[0].forward", "CLOSURE_MATCH", CastLinear.forward),
        ]
    monkeypatch.setattr(cg.torch_compat, "guard_arguments", lambda e: {"key": "comfy_cast_weights"})

    def env():
        return binder(pair, (torch.ones(2),), {})

    guards, problems = cg.carry(entries, env())
    assert problems == [] and [g.kind for g in guards].count("contains") == 2
    matched, why = cg.match(guards, env())
    assert matched is not None, why
    tree = torch_compat.GuardTree()
    cg.build_tree(tree, matched, env())
    assert tree.check(env()) and tree.leaves == 2 + 3  # 2 type leaves; the membership, the constant, the code: once
    changes = [
        lambda: setattr(pair, "b", CastShadow()),  # another class on one submodule: only its type leaf sees it
        lambda: setattr(pair, "b", CastLinear()),
        lambda: setattr(CastMid, "comfy_cast_weights", False),  # a base class gains the attribute
        lambda: delattr(CastMid, "comfy_cast_weights"),
        lambda: setattr(CastBase, "cast_mode", 2),
        lambda: setattr(CastBase, "cast_mode", 1),
    ]
    results = []
    for change in changes:
        change()
        results.append((matched.still(env()), _interpreted_still(matched, env()), tree.check(env())))
    assert results == [(False,) * 3, (True,) * 3] * 3, results


def test_a_carried_code_guard_on_a_function_the_traced_code_pins_is_built_once(monkeypatch) -> None:
    """``G['attention']``'s code is carried; the traced code's path to the same module-level function pins the
    function object and its ``__code__``: in one tree the carried leaf is not built again, and the tree still fails
    when the module's entry is replaced or the function's code is."""
    import sys

    from steadfast.core.compile.warm import traced_code

    block = Block()
    binder = cg.Binder(Block.forward)

    def env():
        return binder(block, (torch.ones(2),), {})

    guards, problems = cg.carry([entry("G['attention']", "CLOSURE_MATCH", attention)], env())
    matched, _ = cg.match(guards, env())
    identity, problems = traced_code.resolve(
        {f"function {__name__}:attention": traced_code.function_digest(attention)}
    )
    assert matched is not None and identity is not None and problems == []
    trees = []
    for pinned in (None, identity.module_functions()):
        tree = torch_compat.GuardTree()
        traced_code.build_tree(tree, identity)
        cg.build_tree(tree, matched, env(), pinned)
        assert tree.check(env())
        trees.append(tree)
    assert trees[1].leaves == trees[0].leaves - 1
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "attention", other_attention)
    assert not trees[1].check(env()) and not matched.still(env())
    monkeypatch.undo()
    monkeypatch.setattr(attention, "__code__", other_attention.__code__)
    assert not trees[1].check(env()) and not matched.still(env())
    monkeypatch.undo()
    assert trees[1].check(env())


class Tag:
    """An object in ``transformer_options`` whose type torch guards and whose ``name`` only the pack's leaf reads."""

    def __init__(self, name: str) -> None:
        self.name = name


class ReadsOptions(torch.nn.Module):
    """A block that iterates over ``transformer_options`` (as ComfyUI's blocks do over its patches): torch guards that
    dict's keys in order, with a ``DictGuardManager``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x, transformer_options={}):  # noqa: B006
        return self.lin(x) * sum(v for v in transformer_options.values() if isinstance(v, float))  # iterates


def test_the_pack_checks_join_a_copy_of_the_artifacts_own_guard_tree(tmp_path) -> None:
    """The route's one tree per answer (issue 45 item 2): a copy of the loaded artifact's C++ guard tree with the
    pack's leaves added. One check then fails on torch's guards (a shape, the entry the trace read) and on the pack's
    (a carried value); two answers of one loaded artifact (block positions whose graphs are byte-equal) keep their
    own values, and the artifact's own tree gains nothing. The block reads ``transformer_options``, so torch's tree
    holds that dict under a ``DictGuardManager`` (no accessor by key: the pack's reach the locals their own way)."""
    block, x = ReadsOptions(), torch.ones(2)
    with torch_compat.aot_compile_enabled():
        compiled = torch.compile(ReadsOptions.forward, fullgraph=True)
        aot = compiled.aot_compile(((block, x), {"transformer_options": {"scale": 2.0, "tag": Tag("input")}}))
    aot.save_compiled_function(str(tmp_path / "a.pt2"))
    with open(tmp_path / "a.pt2", "rb") as f:
        fn = torch.compiler.load_compiled_function(f)
    manager = torch_compat.artifact_guard_manager(fn)
    assert manager is not None
    binder = cg.Binder(ReadsOptions.forward)

    def env(position, inp=x, scale=2.0):
        return binder(block, (inp,), {"transformer_options": {"scale": scale, "tag": Tag(position)}})

    trees = {}
    for position in ("input", "output"):
        tree = torch_compat.GuardTree(manager)
        base = tree.leaves
        here = env(position)
        options = here["transformer_options"]
        om = tree.item(tree.frame(here), "transformer_options", "L['transformer_options']", options)
        tag = tree.item(om, "tag", "L['transformer_options']['tag']", options["tag"])
        name = tree.attr(tag, "name", "L['transformer_options']['tag'].name", position)
        tree.type_is(name, str, "the tag's name is a str")
        tree.equals(name, position, f"the tag's name == {position!r}")
        assert tree.leaves == base + 2 and base > 0
        trees[position] = tree
    assert trees["input"].check(env("input")) and trees["output"].check(env("output"))
    assert not trees["input"].check(env("output")) and not trees["output"].check(env("input"))
    assert "name == 'input'" in trees["input"].failure(env("output"))
    assert manager.check(env("output")) and manager.check(env("input"))  # the artifact's own tree is untouched
    wider = torch.ones(3)
    assert not manager.check(env("input", wider)) and not trees["input"].check(env("input", wider))  # torch's guard
    assert not manager.check(env("input", scale=3.0)) and not trees["input"].check(env("input", scale=3.0))
    options = {"transformer_options": {"scale": 2.0, "tag": Tag("input")}}
    assert not torch.equal(fn(block, x, **options), fn(block, torch.full((2,), 2.0), **options))  # reads its input
