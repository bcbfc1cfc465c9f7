"""silu_and_mul: [..., 2d] (gate | up) → silu(gate) * up, [..., d]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import FLOAT_DTYPES, check, check_dtype, pdl, pdl_prologue, pow2


@triton.jit
def silu_mul(gate, up, dtype: tl.constexpr):
    """silu(gate) * up of float32 gate and up, in dtype, rounded as F.silu(gate) * up rounds: the silu to dtype
    before the multiply."""
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (silu * up).to(dtype)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, sx_row, D, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # grid (rows, cdiv(D, BLOCK)); out is contiguous [rows, D].
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < D
    g = tl.load(x_ptr + row * sx_row + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * sx_row + D + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + offs, silu_mul(g, u, out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x):
    """x [..., 2d], last dim contiguous → [..., d] (new, contiguous)."""
    check_dtype("x", x, FLOAT_DTYPES)
    check(x.dim() >= 1 and x.shape[-1] % 2 == 0, f"last dim must be even (gate | up), got {tuple(x.shape)}")
    check(x.stride(-1) == 1, "x needs a contiguous last dim")
    d = x.shape[-1] // 2
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows and d:
        block = min(pow2(d), 1024)
        _silu_and_mul_kernel[(rows, triton.cdiv(d, block))](x2, out, x2.stride(0), d, BLOCK=block, **pdl(x.device))
    return out
