"""linear for one row (batch-1 decode): y = x @ weight^T + bias as a GEMV that streams the weight once.

With one row a linear layer is a weight read, which cuBLAS's skinny kernels (split-K plus a reduce launch) do well
below copy bandwidth (docs/kernels/linear.md). Here one launch, no split-K: a program owns BLOCK_N weight rows,
streams them in BLOCK_K tiles and accumulates CUDA-core FMAs in fp32 (one row fills no tensor-core tile); BLOCK_N
is small enough that the grid covers the GPU even for 1024-row layers. Rounded once to the output dtype after the
bias (added in fp32), as cuBLAS's epilogue does; sums differ from cuBLAS's only in order. At 2-8 rows a tensor-core
variant only matched cuBLAS, so those stay with it (timings: docs/kernels/linear.md).

The kernel can also run the op in front of the layer as its prologue (fused_linear.py): add + RMSNorm for qkv and
gate_up, SiLU-and-mul for down. Each program then redoes that op over the whole input row (from L2), which
costs about what the separate launch it replaces did, and a little less overall (docs/kernels/linear.md).

More rows, a weight that is not K-contiguous, dtypes other than the float ones, or a compiler tracing the model
(vLLM's inductor: it picks its own GEMMs) take F.linear, the vendor GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from atom_kernels.triton._utils import FLOAT_DTYPES, pdl, pdl_prologue, pow2
from atom_kernels.triton.activation import silu_mul
from atom_kernels.triton.norm import add_residual, rms_scale


@triton.jit
def _add_residual(x, r_ptr, kk, mask):
    """x + residual[kk], rounded to x's dtype as the reference adds."""
    return add_residual(x, tl.load(r_ptr + kk, mask=mask, other=0.0))


@triton.jit
def _input_tile(x_ptr, r_ptr, nw_ptr, r_out_ptr, kk, mask, K, rstd, WRITE_RES,
                PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr):
    """The GEMV's input x[kk] in float32, after its prologue, rounded as the separate ops round:
    0 x itself; 1 RMSNorm(x + residual) (rstd given; the sum stored when WRITE_RES); 2 silu(gate) * up, x = [gate | up]
    of 2K."""
    dtype = x_ptr.dtype.element_ty
    if PROLOGUE == 2:
        g = tl.load(x_ptr + kk, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + K + kk, mask=mask, other=0.0).to(tl.float32)
        return silu_mul(g, u, dtype).to(tl.float32)
    x = tl.load(x_ptr + kk, mask=mask, other=0.0)
    if PROLOGUE == 1:
        if HAS_RES:
            x = _add_residual(x, r_ptr, kk, mask)
            tl.store(r_out_ptr + kk, x, mask=mask & WRITE_RES)
        x = rms_scale(x.to(tl.float32), tl.load(nw_ptr + kk, mask=mask, other=0.0), rstd, dtype, dtype)
    return x.to(tl.float32)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, r_ptr, nw_ptr, r_out_ptr, eps, N, K, sw, HAS_BIAS: tl.constexpr,
                 PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr, PDL: tl.constexpr):
    # grid (cdiv(N, BLOCK_N),): y[n0:n0+BLOCK_N] = w[n0:n0+BLOCK_N] @ prologue(x) (+ b), x one row of K.
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(n, N - 1).to(tl.int64)  # the last block re-reads row N-1 instead of masking every load
    pdl_prologue(PDL)
    k = tl.arange(0, BLOCK_K)
    rstd = 1.0
    if PROLOGUE == 1:  # every program reads the whole row (from L2) for its mean square; program 0 stores x + r
        ss = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + k0 + k, mask=k < K - k0, other=0.0)
            if HAS_RES:
                x = _add_residual(x, r_ptr, k0 + k, k < K - k0)
            ss += x.to(tl.float32) * x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
    write_res = tl.program_id(0) == 0
    w_ptrs = w_ptr + rows[:, None] * sw + k[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)  # reduced over K once, after the loop
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs, eviction_policy="evict_first")
            x = _input_tile(x_ptr, r_ptr, nw_ptr, r_out_ptr, k0 + k, k < BLOCK_K, K, rstd, write_res, PROLOGUE,
                            HAS_RES)
        else:
            k_mask = k < K - k0
            w = tl.load(w_ptrs, mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
            x = _input_tile(x_ptr, r_ptr, nw_ptr, r_out_ptr, k0 + k, k_mask, K, rstd, write_res, PROLOGUE, HAS_RES)
        acc += w.to(tl.float32) * x[None, :]
        w_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(b_ptr + rows).to(tl.float32)
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=n < N)


def gemv_config(n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for a [k] x [n, k]^T GEMV: 4-row tiles of 1024 columns (8 KB
    per bf16 load, >= 256 programs for 1024-row layers); the fastest, or close to it, on every Qwen3-0.6B layer
    in the sweep (linear_gemv.py --sweep; docs/kernels/linear.md)."""
    return 4, min(1024, pow2(k)), 4, 1


def use_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """One row of x, a float dtype shared with a K-contiguous 2-D weight, a contiguous bias, and no compiler
    tracing the call."""
    return (not torch.compiler.is_compiling() and x.dtype == weight.dtype and weight.dtype in FLOAT_DTYPES
            and weight.dim() == 2 and weight.stride(1) == 1
            and (bias is None or bias.is_contiguous()) and x.shape[-1] == weight.shape[1] > 0
            and x.numel() == x.shape[-1])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed=None) -> torch.Tensor:
    """The reference's contract (atom_kernels.reference.linear); `packed` is unused (pack_linear makes nothing)."""
    if not use_gemv(x, weight, bias):
        return F.linear(x, weight, bias)
    return gemv(x.reshape(-1).contiguous(), weight, bias).view(*x.shape[:-1], weight.shape[0])


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
         cfg: tuple[int, int, int, int] | None = None, prologue: int = 0, residual: torch.Tensor | None = None,
         norm_weight: torch.Tensor | None = None, eps: float = 0.0,
         residual_out: torch.Tensor | None = None) -> torch.Tensor:
    """x [K] (contiguous; prologue 2: [2K]), weight [N, K] (stride(1) == 1), bias [N] or None → [N]; cfg:
    gemv_config's answer by default (benchmarks/linear_gemv.py --sweep passes others). prologue (see _input_tile):
    1 = RMSNorm with norm_weight [K], eps and optional residual [K] (x + residual into residual_out [K]); 2 = SiLU
    and mul. All contiguous, x's dtype."""
    n, k = weight.shape
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    block_n, block_k, warps, stages = cfg or gemv_config(n, k)
    launch = pdl(x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, y, x if residual is None else residual,
        x if norm_weight is None else norm_weight, x if residual_out is None else residual_out, float(eps), n, k,
        weight.stride(0), HAS_BIAS=bias is not None, PROLOGUE=prologue, HAS_RES=residual is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0, num_warps=warps, num_stages=stages, **launch)
    return y
