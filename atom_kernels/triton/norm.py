"""rms_norm (+ fused residual add) over the last dim, rows addressed through strides."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import FLOAT_DTYPES, check, check_dtype, check_same_device, pdl, pdl_prologue, pow2

TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def rms_scale(x, w, rstd, X_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """weight * (x * rstd).to(x dtype), rounded like the torch reference; returns float32."""
    h = (x * rstd).to(X_DTYPE).to(tl.float32)
    return (w.to(tl.float32) * h).to(OUT_DTYPE).to(tl.float32)


@triton.jit
def add_residual(x, r):
    """x + residual, rounded to x's dtype as the reference adds."""
    return (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)


@triton.jit
def rms_norm_row(x_row, r_row, w_ptr, res_row, eps, N, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                 OUT_DTYPE: tl.constexpr):
    """One row of N columns held whole (BLOCK >= N): weight * normed(x (+ the residual, the sum stored at res_row)),
    float32 rounded as the reference rounds; masked columns 0."""
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_row + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = add_residual(x, tl.load(r_row + offs, mask=mask, other=0.0))
        tl.store(res_row + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    return rms_scale(xf, w, rstd, x_row.dtype.element_ty, OUT_DTYPE)


@triton.jit
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr, eps,
    sx_a, sx_b, sr_a, sr_b, B, N,
    BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, OUT_DTYPE: tl.constexpr, PDL: tl.constexpr,
):
    # One program per row; rows are [A, B] (two leading dims, any strides), the last dim contiguous.
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    a, b = row // B, row % B
    y = rms_norm_row(x_ptr + a * sx_a + b * sx_b, r_ptr + a * sr_a + b * sr_b, w_ptr, res_out_ptr + row * N, eps, N,
                     BLOCK, HAS_RESIDUAL, OUT_DTYPE)
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + row * N + offs, y.to(OUT_DTYPE), mask=offs < N)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[..., N] → a [A, B, N] view (a copy only for >3-D inputs that cannot be viewed)."""
    if x.dim() == 1:
        return x.view(1, 1, -1)
    if x.dim() == 2:
        return x.unsqueeze(1)
    return x if x.dim() == 3 else x.reshape(-1, x.shape[-2], x.shape[-1])


def rms_norm(x, weight, eps, residual=None):
    """x [..., N] (last dim contiguous) → weight * normed(x); with residual: (normed(x + r), x + r)."""
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("weight", weight, FLOAT_DTYPES)
    n = x.shape[-1]
    check(weight.shape == (n,), f"weight must be [{n}], got {tuple(weight.shape)}")
    check(x.stride(-1) == 1 and weight.stride(0) == 1, "x and weight need a contiguous last dim")
    check_same_device(x=x, weight=weight, residual=residual)
    out_dtype = torch.result_type(weight, x)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    res_out = None
    x3 = _rows(x)
    r3 = x3
    if residual is not None:
        check(residual.shape == x.shape and residual.dtype == x.dtype,
              f"residual {tuple(residual.shape)}/{residual.dtype} must match x {tuple(x.shape)}/{x.dtype}")
        check(residual.stride(-1) == 1, "residual needs a contiguous last dim")
        res_out = torch.empty_like(x, memory_format=torch.contiguous_format)
        r3 = _rows(residual)
    rows = x3.shape[0] * x3.shape[1]
    if rows:
        block = pow2(n)
        _rms_norm_kernel[(rows,)](
            x3, r3, weight, out, res_out if res_out is not None else out, float(eps),
            x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1), x3.shape[1], n,
            BLOCK=block, HAS_RESIDUAL=residual is not None, OUT_DTYPE=TL_DTYPES[out_dtype],
            num_warps=min(max(block // 512, 1), 16), **pdl(x.device),
        )
    return out if residual is None else (out, res_out)
