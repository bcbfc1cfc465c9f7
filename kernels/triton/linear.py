"""linear for one row (batch-1 decode): y = x @ weight^T + bias as a GEMV that streams the weight once.

With one row a linear layer is a weight read. cuBLAS's skinny kernels (nvjet 64x8 tiles, split-K plus a reduce
launch) spent 0.65 ms of the 1.17 ms batch-1 decode graph on the Qwen3-0.6B layers on an H100 (~44% of copy
bandwidth; profile 2026-11-24). Here one launch, no split-K: a program owns BLOCK_N weight rows, streams them in
BLOCK_K tiles and accumulates CUDA-core FMAs in fp32 (one row fills no tensor-core tile); BLOCK_N is small enough
that the grid covers the GPU even for 1024-row layers. Rounded once to the output dtype after the bias (added in
fp32), as cuBLAS's epilogue does; sums differ from cuBLAS's only in order.
H100 (benchmarks/linear_gemv.py, L2 flushed): a Qwen3-0.6B layer's four GEMMs 29.7 vs 37.2 us, its LM head 101 vs
113 us; the batch-1 decode graph 0.91 ms instead of 1.17. At 2-8 rows a tensor-core variant only matched cuBLAS
(0.95-0.97 per layer), so those stay with it.

More rows, a weight that is not K-contiguous, dtypes other than the float ones, or a compiler tracing the model
(vLLM's inductor: it picks its own GEMMs) take F.linear, the vendor GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from atom_kernels.triton._utils import FLOAT_DTYPES, pow2


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, sw, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    # grid (cdiv(N, BLOCK_N),): y[n0:n0+BLOCK_N] = w[n0:n0+BLOCK_N] @ x (+ b), x one row of K
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(n, N - 1).to(tl.int64)  # the last block re-reads row N-1 instead of masking every load
    k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None] * sw + k[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)  # reduced over K once, after the loop
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs, eviction_policy="evict_first")
            x = tl.load(x_ptr + k0 + k)
        else:
            k_mask = k < K - k0
            w = tl.load(w_ptrs, mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptr + k0 + k, mask=k_mask, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        w_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(b_ptr + rows).to(tl.float32)
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=n < N)


def gemv_config(n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for a [k] x [n, k]^T GEMV: 4-row tiles of 1024 columns (8 KB
    per bf16 load, >= 256 programs for 1024-row layers); fastest or within 0.4 us of it on every Qwen3-0.6B
    layer in the H100 sweep (linear_gemv.py --sweep, 2026-11-24)."""
    return 4, min(1024, pow2(k)), 4, 1


def _use_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return (x.dtype == weight.dtype and weight.dtype in FLOAT_DTYPES and weight.dim() == 2 and weight.stride(1) == 1
            and (bias is None or bias.is_contiguous()) and x.shape[-1] == weight.shape[1] > 0
            and x.numel() == x.shape[-1])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed=None) -> torch.Tensor:
    """The reference's contract (atom_kernels.reference.linear); `packed` is unused (pack_linear makes nothing)."""
    if torch.compiler.is_compiling() or not _use_gemv(x, weight, bias):
        return F.linear(x, weight, bias)
    return gemv(x.reshape(-1).contiguous(), weight, bias).view(*x.shape[:-1], weight.shape[0])


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
         cfg: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """x [K] (contiguous), weight [N, K] (stride(1) == 1), bias [N] or None → [N]; cfg: gemv_config's answer by
    default (benchmarks/linear_gemv.py --sweep passes others)."""
    n, k = weight.shape
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    block_n, block_k, warps, stages = cfg or gemv_config(n, k)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, y, n, k, weight.stride(0), HAS_BIAS=bias is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0, num_warps=warps, num_stages=stages)
    return y
