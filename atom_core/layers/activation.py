"""Gated activation layer."""

from __future__ import annotations

import torch
from torch import nn

import atom_kernels


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., 2d] → [..., d]"""
        return atom_kernels.silu_and_mul(x)


def get_act_and_mul(name: str) -> nn.Module:
    if name in ("silu", "swish"):
        return SiluAndMul()
    raise ValueError(f"hidden_act={name!r} is not supported; supported: silu")
