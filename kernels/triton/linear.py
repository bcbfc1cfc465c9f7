"""linear for a few rows (decode steps): y = x @ weight^T + bias as a GEMV that streams the weight once.

With M <= GEMV_MAX_ROWS rows a linear layer is a weight read. cuBLAS's skinny kernels (nvjet 64x8 tiles, split-K
plus a reduce launch) read the Qwen3-0.6B layer weights at ~44% of copy bandwidth at batch 1 on an H100
(profile 2026-11-24: 0.65 of the 1.17 ms decode graph). Here one launch, no split-K: a program owns BLOCK_N
weight rows and all M rows of x, streams its rows' K in BLOCK_K tiles (loaded once, used for every x row) and
accumulates in fp32: with CUDA-core FMAs for one row, as a tensor-core dot against x padded to 16 rows for more
(fp32 in IEEE precision, never TF32). BLOCK_N is small enough that the grid covers the GPU even for 1024-row
layers. Rounded once to the output dtype after the bias (in fp32), as
cuBLAS's epilogue does; sums differ from cuBLAS's only in order.

More rows, a weight that is not K-contiguous, dtypes other than the float ones, or a compiler tracing the model
(vLLM's inductor: it picks its own GEMMs) take F.linear, the vendor GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from atom_kernels.triton._utils import FLOAT_DTYPES, pow2

GEMV_MAX_ROWS = 8


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sx, sw, sy, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr):
    # grid (cdiv(N, BLOCK_N),): y[:M, n0:n0+BLOCK_N] = x[:M] @ w[n0:n0+BLOCK_N]^T (+ b)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    rows = tl.minimum(n, N - 1).to(tl.int64)  # the last block re-reads row N-1 instead of masking every load
    k = tl.arange(0, BLOCK_K)
    m = tl.arange(0, BLOCK_M)
    m_mask = m < M
    w_ptrs = w_ptr + rows[:, None] * sw + k[None, :]  # [BLOCK_N, BLOCK_K]
    xt_ptrs = x_ptr + m[None, :] * sx + k[:, None]  # [BLOCK_K, BLOCK_M]: x transposed
    # One row (BLOCK_M == 1): CUDA-core FMAs into a [BLOCK_N, BLOCK_K] accumulator reduced once after the loop.
    # More rows: a tensor-core dot of the weight tile with x^T padded to 16 columns (the padding costs no bytes).
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs, eviction_policy="evict_first")
            xt = tl.load(xt_ptrs, mask=m_mask[None, :], other=0.0)
        else:
            k_mask = k < K - k0
            w = tl.load(w_ptrs, mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
            xt = tl.load(xt_ptrs, mask=m_mask[None, :] & k_mask[:, None], other=0.0)
        if BLOCK_M == 1:
            acc2 += w.to(tl.float32) * tl.trans(xt).to(tl.float32)
        else:
            acc = tl.dot(w, xt, acc, input_precision=PRECISION)
        w_ptrs += BLOCK_K
        xt_ptrs += BLOCK_K
    if BLOCK_M == 1:
        acc += tl.sum(acc2, axis=1)[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows).to(tl.float32)[:, None]
    y_ptrs = y_ptr + m[None, :] * sy + n[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


def gemv_config(m: int, n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for an [m, k] x [n, k]^T GEMV (H100 sweep, linear_gemv.py)."""
    if m == 1:  # 4-row tiles of 1024 columns: 8 KB per load, >= 256 programs for 1024-row layers
        return 4, min(1024, pow2(k)), 4, 1
    return 16, min(256, pow2(k, 16)), 4, 3


def _use_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return (x.dtype == weight.dtype and weight.dtype in FLOAT_DTYPES and weight.dim() == 2
            and weight.stride(1) == 1 and (bias is None or bias.is_contiguous()) and x.shape[-1] == weight.shape[1]
            and 0 < x.numel() // max(x.shape[-1], 1) <= GEMV_MAX_ROWS)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed=None) -> torch.Tensor:
    """The reference's contract (atom_kernels.reference.linear); `packed` is unused (pack_linear makes nothing)."""
    if torch.compiler.is_compiling() or not _use_gemv(x, weight, bias):
        return F.linear(x, weight, bias)
    x2 = x.reshape(-1, weight.shape[1])
    y = gemv(x2 if x2.stride(1) == 1 else x2.contiguous(), weight, bias)
    return y.view(*x.shape[:-1], weight.shape[0])


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
         cfg: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """x [M, K] (stride(1) == 1, M <= GEMV_MAX_ROWS), weight [N, K] (stride(1) == 1) → [M, N]; cfg: gemv_config's
    answer by default (benchmarks/linear_gemv.py --sweep passes others)."""
    (m, k), n = x.shape, weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_n, block_k, warps, stages = cfg or gemv_config(m, n, k)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=1 if m == 1 else 16, BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=k % block_k == 0, PRECISION="ieee", num_warps=warps,
        num_stages=stages)
    return y
