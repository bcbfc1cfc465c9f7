"""RMSNorm (+ fused residual add), computed in float32 like transformers' Llama/Qwen3 RMSNorm."""

from __future__ import annotations

import torch


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x: [..., hidden]. With residual: returns (norm(x + residual), x + residual)."""
    if residual is not None:
        # x + residual rounded to x's dtype, the sum made in float32: equal to a 16-bit add (two bf16/fp16
        # values sum exactly in float32), but a compiler tracing this (vLLM's inductor) no longer folds the add
        # into the GEMM that made x, as an addmm that first copies the residual into its output.
        dtype = torch.promote_types(x.dtype, residual.dtype)
        x = (x.float() + residual.float()).to(dtype) if dtype in (torch.bfloat16, torch.float16) else x + residual
        residual = x
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(dtype)
    return out if residual is None else (out, residual)
