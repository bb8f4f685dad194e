"""core/compile/warm/hooks.py: the hooks the precompiled route cannot run, walked in Python (``hooks_reason``) and
built into an answer's C++ guard tree (``build_hook_checks``), for the call's grad mode. With grad off a backward
hook does nothing in a forward (asserted here on the module itself, not assumed), so the grad-off tree checks that
grad is still off instead of every submodule's backward hook dicts; a forward hook or an instance ``forward`` still
fails it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steadfast.core import torch_compat
from steadfast.core.compile.warm import hooks


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.GELU())
        self.out = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(x))


def _tree(block: nn.Module, grad_enabled: bool) -> torch_compat.GuardTree:
    tree = torch_compat.GuardTree()
    hooks.build_hook_checks(tree, block, grad_enabled)
    return tree


def test_with_grad_off_a_backward_hook_does_nothing_in_forward_and_only_forward_hooks_fail_the_tree() -> None:
    block, x = Block(), torch.randn(2, 4, requires_grad=True)
    env = {"self": block}
    ran = []
    with torch.no_grad():
        plain = block(x)
        off, on = _tree(block, grad_enabled=False), _tree(block, grad_enabled=True)
    assert off.leaves < on.leaves  # 2 hook dicts per module, not 4 (and one grad-mode leaf)
    with torch.no_grad():
        assert off.check(env) and hooks.hooks_reason(block) is None
    assert not off.check(env)  # grad is on here: the grad-off tree does not answer
    assert on.check(env)

    handle = block.inner[0].register_full_backward_hook(lambda m, gi, go: ran.append(1))
    pre = block.out.register_full_backward_pre_hook(lambda m, go: ran.append(2))
    with torch.no_grad():
        hooked = block(x)
        assert off.check(env) and hooks.hooks_reason(block) is None  # no effect in this forward: nothing to run
    assert torch.equal(hooked, plain) and ran == []  # the claim, on the module itself: same bytes, no hook ran
    assert not on.check(env) and "has a hook" in (hooks.hooks_reason(block) or "")  # with grad they act
    handle.remove()
    pre.remove()

    fwd = block.inner[0].register_forward_hook(lambda m, i, o: o * 2)
    with torch.no_grad():
        assert not off.check(env) and "submodule 'inner.0' has a hook" in hooks.hooks_reason(block)
    fwd.remove()
    block.out.forward = lambda t: t  # an instance forward (an object patch)
    with torch.no_grad():
        assert not off.check(env) and "instance forward" in hooks.hooks_reason(block)
    del block.out.forward
    with torch.no_grad():
        assert off.check(env)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_the_grad_leaf_reads_the_mode_at_each_check(mode: str) -> None:
    block = Block()
    ctx = torch.no_grad if mode == "no_grad" else torch.inference_mode
    with ctx():
        tree = _tree(block, grad_enabled=torch.is_grad_enabled())
        assert tree.check({"self": block})
        with torch.enable_grad():
            if mode == "no_grad":  # inference mode keeps grad off inside enable_grad
                assert not tree.check({"self": block})
    assert not tree.check({"self": block})
