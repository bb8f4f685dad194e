"""Small real torch modules shared by the compile/registry tests (no weights to download)."""
from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """A repeated residual block: LayerNorm -> Linear -> GELU, [B, N, dim] -> [B, N, dim]."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.lin(self.norm(x)))


class Tiny(nn.Module):
    """in-proj -> ``n`` identical :class:`Block` s (a ModuleList) -> out-proj; [B, N, 8] -> [B, N, 8]."""

    def __init__(self, n: int = 4, dim: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(8, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(n))
        self.out = nn.Linear(dim, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def block_paths(model: Tiny) -> list[str]:
    """Dotted paths of ``model``'s repeated blocks: ``["blocks.0", ...]``."""
    return [f"blocks.{i}" for i in range(len(model.blocks))]
