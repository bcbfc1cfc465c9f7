"""fused_moe for a few tokens (decode): each (token, k) pair's expert as two GEMVs, no alignment pass.

When tokens * top_k is small next to the number of experts (Qwen3-30B-A3B at batch 1: 8 pairs, 128 experts),
almost every pair has an expert of its own: grouping pairs into BLOCK_M-row blocks (moe/align.py) buys no
weight reuse, costs a launch, and pads every block to >= 16 rows. Here no grouping:
  1. gate/up: grid (pairs, cdiv(I, BLOCK_N)); a program streams BLOCK_N gate rows and the same up rows of its
     pair's expert against the token's row (CUDA-core FMAs in fp32: one row gives no tensor-core tile) and
     stores act [pairs, I], rounded like the reference (gate, up, silu(gate), product each to the dtype);
  2. down + top-k sum: grid (tokens, cdiv(H, BLOCK_N)); a program takes its token's K pairs together, each a
     GEMV of act against BLOCK_N rows of w2[e], rounds it, scales it by the routing weight (cast to the dtype,
     rounded), and adds the K of them in fp32, rounded once: no y [pairs, H] buffer and no summing launch.
Same arithmetic as the block kernels (moe.py), whose results these equal up to fp32 summation order. Pairs whose
expert id lies outside [0, E) are skipped (their loads are masked off), as moe_align drops them: -1 marks an expert
of another rank (expert parallelism). Two launches,
no host sync, grids from shapes: CUDA-graph capturable. Weights are [.., rows, K-contiguous] (sw_k == 1 as
loaded), so each program's tile loads are row-contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import pdl, pdl_prologue, pow2
from atom_kernels.triton.activation import silu_mul


@triton.jit
def _gate_up_gemv_kernel(x_ptr, w_ptr, ids_ptr, act_ptr, E, H, INTER, top_k, sx, sw_e, sw_n, sw_k,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr):
    # grid (pairs, cdiv(INTER, BLOCK_N)): act[pair, n] = silu(x[tok] . w13[e, n]) * (x[tok] . w13[e, INTER + n])
    pdl_prologue(PDL)
    pair = tl.program_id(0).to(tl.int64)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    if (e < 0) | (e >= E):  # dropped pair: its act row is never read
        return
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < INTER
    k = tl.arange(0, BLOCK_K)
    x_row = x_ptr + (pair // top_k) * sx
    g_ptrs = w_ptr + e * sw_e + n[:, None] * sw_n + k[None, :] * sw_k  # [BLOCK_N, BLOCK_K] of w13[e]
    u_ptrs = g_ptrs + INTER * sw_n
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)  # reduced over K once, after the loop
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_row + k0 + k).to(tl.float32)
            g = tl.load(g_ptrs, mask=n_mask[:, None], other=0.0)
            u = tl.load(u_ptrs, mask=n_mask[:, None], other=0.0)
        else:
            km = k < H - k0
            x = tl.load(x_row + k0 + k, mask=km, other=0.0).to(tl.float32)
            g = tl.load(g_ptrs, mask=n_mask[:, None] & km[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=n_mask[:, None] & km[None, :], other=0.0)
        acc_g += g.to(tl.float32) * x[None, :]
        acc_u += u.to(tl.float32) * x[None, :]
        g_ptrs += BLOCK_K * sw_k
        u_ptrs += BLOCK_K * sw_k
    dtype = act_ptr.dtype.element_ty
    gate = tl.sum(acc_g, axis=1).to(dtype).to(tl.float32)
    up = tl.sum(acc_u, axis=1).to(dtype).to(tl.float32)
    tl.store(act_ptr + pair * INTER + n, silu_mul(gate, up, dtype), mask=n_mask)


@triton.jit
def _down_gemv_sum_kernel(act_ptr, w_ptr, ids_ptr, weights_ptr, out_ptr, E, H, INTER, sw_e, sw_n, sw_k,
                          TOP_K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          PDL: tl.constexpr):
    # grid (T, cdiv(H, BLOCK_N)): out[t, n] = sum_k round(round(act[t*K + k] . w2[e_k, n]) * round(weight[t, k]))
    # All K pairs of the token in one [K_PAD, BLOCK_N, BLOCK_K] tile per step: K weight tiles in flight at once
    # (one expert at a time left each program waiting on one small load after another).
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < H
    j = tl.arange(0, K_PAD)
    pair = t * TOP_K + j
    e = tl.load(ids_ptr + pair, mask=j < TOP_K, other=-1).to(tl.int64)
    ok = (e >= 0) & (e < E)  # padding and dropped pairs add nothing and load nothing
    k = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + pair[:, None] * INTER + k[None, :]  # [K_PAD, BLOCK_K]
    b_ptrs = (w_ptr + tl.where(ok, e, 0)[:, None, None] * sw_e + n[None, :, None] * sw_n
              + k[None, None, :] * sw_k)  # [K_PAD, BLOCK_N, BLOCK_K]
    acc = tl.zeros([K_PAD, BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        km = k < INTER - k0
        a = tl.load(a_ptrs, mask=ok[:, None] & km[None, :], other=0.0).to(tl.float32)
        b = tl.load(b_ptrs, mask=ok[:, None, None] & n_mask[None, :, None] & km[None, None, :], other=0.0)
        acc += b.to(tl.float32) * a[:, None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * sw_k
    dtype = out_ptr.dtype.element_ty
    w = tl.load(weights_ptr + pair, mask=ok, other=0.0).to(dtype).to(tl.float32)
    y = (tl.sum(acc, axis=2).to(dtype).to(tl.float32) * w[:, None]).to(dtype).to(tl.float32)  # [K_PAD, BLOCK_N]
    total = tl.sum(tl.where(ok[:, None], y, 0.0), axis=0)
    tl.store(out_ptr + t * H + n, total.to(dtype), mask=n_mask)


def fused_moe_gemv(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, cfg: dict) -> torch.Tensor:
    """fused_moe's contract (arguments checked by the caller); cfg: moe_config's gemv dict."""
    (t, h), inter, top_k = hidden.shape, w13.shape[1] // 2, topk_ids.shape[1]
    out = torch.empty_like(hidden)
    act = torch.empty((t * top_k, inter), dtype=hidden.dtype, device=hidden.device)
    launch = pdl(hidden.device)
    bn, bk, warps = cfg["up"]
    _gate_up_gemv_kernel[(t * top_k, triton.cdiv(inter, bn))](
        hidden, w13, topk_ids, act, w13.shape[0], h, inter, top_k, hidden.stride(0), *w13.stride(),
        BLOCK_N=bn, BLOCK_K=bk, EVEN_K=h % bk == 0, num_warps=warps, **launch)
    bn, bk, warps = cfg["down"]
    _down_gemv_sum_kernel[(t, triton.cdiv(h, bn))](
        act, w2, topk_ids, topk_weights, out, w13.shape[0], h, inter, *w2.stride(), TOP_K=top_k,
        K_PAD=pow2(top_k), BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, **launch)
    return out
