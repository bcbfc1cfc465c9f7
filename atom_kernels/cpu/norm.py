"""rms_norm on CPU: torch.rms_norm, the reference's pow / mean / rsqrt / mul in one call (the same float32
operations in the same order)."""

from __future__ import annotations

import torch

from atom_kernels import reference
from atom_kernels.cpu import all_float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """As reference.rms_norm: x [..., hidden] → norm(x), or with residual (norm(x + residual), x + residual)."""
    if not all_float32(x, weight):
        return reference.rms_norm(x, weight, eps, residual)
    if residual is not None:
        x = residual = x + residual
    out = torch.rms_norm(x, (x.shape[-1],), weight, eps)
    return out if residual is None else (out, residual)
