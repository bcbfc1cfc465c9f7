"""RMSNorm layer over atom_kernels.rms_norm."""

from __future__ import annotations

import torch
from torch import nn

import atom_kernels


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x: [..., hidden]. With residual: returns (norm(x + residual), x + residual)."""
        return atom_kernels.rms_norm(x, self.weight, self.eps, residual)
