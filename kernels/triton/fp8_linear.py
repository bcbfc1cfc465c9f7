"""fp8_linear for the fp8 block format (weight scales per 128 columns, activations per token and group of the same
128 columns): a block-scaled GEMM over e4m3 operands.

Because both scales are constant over one K block, each block's partial product factors: y[m, n] = sum_b xs[m, b] *
ws[n, b] * sum_{k in b} xq[m, k] * wq[n, k]. A program owns a BLOCK_M x BLOCK_N tile of y, walks K one scale block
at a time (BLOCK_K = block_k), takes the block's dot product of the e4m3 tiles (fp8 tensor cores on sm_89+; elsewhere
and for blocks under 32 columns, of the tiles converted to float16, exact: every e4m3 value is a float16), with float32
accumulation, and adds it times the outer product of the two scale vectors. The activation is quantized first by
fp8_quantize_rows (bit-equal to the reference's fp8_quantize).

Everything else (per-channel / per-tensor weights, another activation group, a static input_scale, no activation
quantization) runs the torch reference. A compiler tracing the model never enters here: atom_kernels.fp8_linear is a
torch library op, opaque to it. Tested against it under Triton's CPU
interpreter only (tests/kernels/test_triton_fp8_linear_interpreter.py): no GPU has compiled or timed it yet.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.reference import fp8 as reference
from atom_kernels.triton._utils import check, pdl, pdl_prologue
from atom_kernels.triton.fp8_quant import fp8_quantize_rows, has_fp8_dot


@triton.jit
def _block_scaled_gemm(xq_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, M, N, K, KB, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8_DOT: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    # grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)); xq [M, K], w [N, K] e4m3 (K-contiguous); xs [M, KB], ws [N, KB] fp32
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(0, KB):
        kk = b * BLOCK_K + rk
        a = tl.load(xq_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[:, None] * K + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)
        if FP8_DOT:
            part = tl.dot(a, tl.trans(w), out_dtype=tl.float32)
        else:
            part = tl.dot(a.to(tl.float16), tl.trans(w.to(tl.float16)), out_dtype=tl.float32)
        xs = tl.load(xs_ptr + rm * KB + b, mask=rm < M, other=0.0)
        ws = tl.load(ws_ptr + rn * KB + b, mask=rn < N, other=0.0)
        acc += part * xs[:, None] * ws[None, :]
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _runs_here(x, weight, weight_scale, block_k, act_group, input_scale) -> bool:
    return (input_scale is None and act_group == block_k
            and block_k in (16, 32, 64, 128, 256) and weight.is_contiguous() and weight_scale.is_contiguous())


def fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale=None, bias=None):
    """The contract of atom_kernels.reference.fp8.fp8_linear: x [..., K] → [..., N] in x's dtype."""
    if not _runs_here(x, weight, weight_scale, block_k, act_group, input_scale):
        return reference.fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale, bias)
    n, k = weight.shape
    kb = -(-k // block_k)
    check(tuple(weight_scale.shape) == (n, kb), f"fp8_linear: weight_scale must be [{n}, {kb}], got "
                                                f"{tuple(weight_scale.shape)}")
    xq, xs = fp8_quantize_rows(x.reshape(-1, k).contiguous(), act_group)
    m = xq.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    block_m, block_n = 16, 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _block_scaled_gemm[grid](xq, xs, weight, weight_scale, y, m, n, k, kb, BLOCK_M=block_m, BLOCK_N=block_n,
                             BLOCK_K=block_k, FP8_DOT=block_k >= 32 and has_fp8_dot(x.device), **pdl(x.device))
    if bias is not None:
        y += bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], n)
