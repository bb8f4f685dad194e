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
