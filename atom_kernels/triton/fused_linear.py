"""RMSNorm → linear and SiLU-and-mul → linear, fused for one row: the norm (with its residual add) or the
activation runs as the prologue of the one-row GEMV (linear.py), which reads the whole input row anyway. A
batch-1 decode layer then launches no norm or activation kernel of its own (docs/kernels/linear.md counts the
launches this saves). Values are rounded where the separate ops round them.
Anything else (more rows, other dtypes, a compiler tracing) runs the two ops (the reference).
"""

from __future__ import annotations

import torch

from atom_kernels.reference import fused_linear as composite
from atom_kernels.triton.linear import gemv, use_gemv


def _row(t: torch.Tensor | None, k: int, dtype: torch.dtype) -> bool:
    return t is None or (t.dtype == dtype and t.numel() == k and t.is_contiguous())


def rms_norm_linear(x, residual, norm_weight, eps, weight, bias=None, packed=None):
    """The reference's contract (atom_kernels.reference.fused_linear)."""
    k = weight.shape[-1]
    if not (use_gemv(x, weight, bias) and _row(residual, k, x.dtype) and _row(norm_weight, k, x.dtype)
            and x.is_contiguous()):
        return composite.rms_norm_linear(x, residual, norm_weight, eps, weight, bias, packed)
    res_out = None if residual is None else torch.empty_like(x)
    y = gemv(x.view(-1), weight, bias, prologue=1, residual=None if residual is None else residual.view(-1),
             norm_weight=norm_weight, eps=eps, residual_out=res_out)
    return y.view(*x.shape[:-1], weight.shape[0]), x if residual is None else res_out


def silu_and_mul_linear(x, weight, bias=None, packed=None):
    """The reference's contract (atom_kernels.reference.fused_linear)."""
    k = weight.shape[-1] if weight.dim() == 2 else -1
    if not (x.shape[-1] == 2 * k and x.numel() == 2 * k and x.is_contiguous()
            and use_gemv(x[..., :k], weight, bias)):
        return composite.silu_and_mul_linear(x, weight, bias, packed)
    return gemv(x.view(-1), weight, bias, prologue=2).view(*x.shape[:-1], weight.shape[0])
