"""fp8_fused_moe for a few tokens (decode): each (token, k) pair's expert as two GEMVs over e4m3 weights.

The structure of moe/gemv.py (no alignment pass; gate/up per pair, then down + the top-k sum per token), with:
  - weights e4m3, dequantized per tile: w[n, k] * scale[n, k // block_k] in fp32, the same product the reference
    forms (its dequantized weight), so only the fp32 summation order differs from it;
  - the activation as the reference's GEMM sees it (ACT): 0 as it is (weights only); 1 already quantized by
    fp8_quantize_rows (e4m3 values times their group's scale); 2 quantized here, per tile, when a tile is exactly one
    group (the fp8 block format: 128-column groups, BLOCK_K = 128), saving the two quantization launches.
K tiles never straddle a weight-scale block or an activation group (k_tile picks BLOCK_K), so each tile has one
weight scale per row and one activation scale per pair. CUDA-core FMAs in fp32 (one row gives no tensor-core tile).
Pairs whose expert id lies outside [0, E) (-1: an expert on another rank) load nothing and add nothing.
Grids from shapes, no host sync: CUDA-graph capturable. Weights and scales need a contiguous last dim.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import pdl, pdl_prologue, pow2
from atom_kernels.triton.activation import silu_mul
from atom_kernels.triton.fp8_quant import fake_quant_rows, fp8_quantize_rows


@triton.jit
def act_tile(x_ptrs, mask, xs_ptrs, row_mask, k0, GROUP, ACT: tl.constexpr):
    """[R, BLOCK_K] fp32 activation tile as the reference's GEMM sees it (see ACT above); xs_ptrs [R, 1]: each
    row's scales (ACT 1), GROUP: columns per activation scale."""
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    if ACT == 1:
        x = x * tl.load(xs_ptrs + k0 // GROUP, mask=row_mask, other=0.0)
    elif ACT == 2:
        x = fake_quant_rows(x)
    return x


@triton.jit
def _fp8_gate_up_gemv_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, ids_ptr, act_ptr, E, H, INTER, top_k, sx, sw_e, sw_n,
                             ss_e, ss_n, block_k, GROUP, G_X, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             ACT: tl.constexpr, PDL: tl.constexpr):
    # grid (pairs, cdiv(INTER, BLOCK_N)): act[pair, n] = silu(x[tok] . w13[e, n]) * (x[tok] . w13[e, INTER + n]),
    # w13 dequantized; x [T, H] (ACT 1: e4m3, xs [T, G_X]); w13 [E, 2I, H] e4m3, ws [E, 2I, ceil(H / block_k)].
    pdl_prologue(PDL)
    pair = tl.program_id(0).to(tl.int64)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    if (e < 0) | (e >= E):  # dropped pair: its act row is never read
        return
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < INTER
    k = tl.arange(0, BLOCK_K)
    tok = pair // top_k
    x_ptrs = x_ptr + tok * sx + k[None, :]  # [1, BLOCK_K]
    g_ptrs = w_ptr + e * sw_e + n[:, None] * sw_n + k[None, :]  # [BLOCK_N, BLOCK_K] of w13[e]
    gs_ptrs = ws_ptr + e * ss_e + n * ss_n  # [BLOCK_N]: the row's scales, + the K block
    one = tl.full([1, 1], 1, tl.int1)  # the token's row mask (ACT 1)
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)  # reduced over K once, after the loop
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        km = (k < H - k0)[None, :]
        x = act_tile(x_ptrs + k0, km, xs_ptr + tok * G_X + tl.zeros([1, 1], tl.int64), one, k0, GROUP, ACT)
        wm = n_mask[:, None] & km
        sg = tl.load(gs_ptrs + k0 // block_k, mask=n_mask, other=0.0)[:, None]
        su = tl.load(gs_ptrs + INTER * ss_n + k0 // block_k, mask=n_mask, other=0.0)[:, None]
        acc_g += tl.load(g_ptrs + k0, mask=wm, other=0.0).to(tl.float32) * sg * x
        acc_u += tl.load(g_ptrs + INTER * sw_n + k0, mask=wm, other=0.0).to(tl.float32) * su * x
    dtype = act_ptr.dtype.element_ty
    gate = tl.sum(acc_g, axis=1).to(dtype).to(tl.float32)
    up = tl.sum(acc_u, axis=1).to(dtype).to(tl.float32)
    tl.store(act_ptr + pair * INTER + n, silu_mul(gate, up, dtype), mask=n_mask)


@triton.jit
def _fp8_down_gemv_sum_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, ids_ptr, weights_ptr, out_ptr, E, H, INTER, sw_e, sw_n,
                              ss_e, ss_n, block_k, GROUP, G_A, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACT: tl.constexpr, PDL: tl.constexpr):
    # grid (T, cdiv(H, BLOCK_N)): out[t, n] = sum_k round(round(act[t*K + k] . w2[e_k, n]) * round(weight[t, k])),
    # w2 [E, H, I] e4m3 dequantized with ws [E, H, ceil(I / block_k)]; act [pairs, I] (ACT 1: e4m3, as [pairs, G_A]).
    # All K pairs of the token in one [K_PAD, BLOCK_N, BLOCK_K] tile per step, as moe/gemv.py.
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < H
    j = tl.arange(0, K_PAD)
    pair = t * TOP_K + j
    e = tl.load(ids_ptr + pair, mask=j < TOP_K, other=-1).to(tl.int64)
    ok = (e >= 0) & (e < E)  # padding and dropped pairs add nothing and load nothing
    e = tl.where(ok, e, 0)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + pair[:, None] * INTER + k[None, :]  # [K_PAD, BLOCK_K]
    b_ptrs = w_ptr + e[:, None, None] * sw_e + n[None, :, None] * sw_n + k[None, None, :]  # [K_PAD, BLOCK_N, BLOCK_K]
    s_ptrs = ws_ptr + e[:, None] * ss_e + n[None, :] * ss_n  # [K_PAD, BLOCK_N]
    sm = ok[:, None] & n_mask[None, :]
    acc = tl.zeros([K_PAD, BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        km = k < INTER - k0
        a = act_tile(a_ptrs + k0, ok[:, None] & km[None, :], as_ptr + pair[:, None] * G_A, ok[:, None], k0, GROUP,
                     ACT)
        s = tl.load(s_ptrs + k0 // block_k, mask=sm, other=0.0)
        b = tl.load(b_ptrs + k0, mask=sm[:, :, None] & km[None, None, :], other=0.0)
        acc += b.to(tl.float32) * s[:, :, None] * a[:, None, :]
    dtype = out_ptr.dtype.element_ty
    w = tl.load(weights_ptr + pair, mask=ok, other=0.0).to(dtype).to(tl.float32)
    y = (tl.sum(acc, axis=2).to(dtype).to(tl.float32) * w[:, None]).to(dtype).to(tl.float32)  # [K_PAD, BLOCK_N]
    total = tl.sum(tl.where(ok[:, None], y, 0.0), axis=0)
    tl.store(out_ptr + t * H + n, total.to(dtype), mask=n_mask)


def k_tile(bk: int, k: int, block_k: int, act_group: int) -> int:
    """BLOCK_K for a GEMM over k columns: bk, halved until it divides the weight-scale block and the activation group
    where these are narrower than k, so that no tile straddles two scales."""
    for group in (block_k, act_group):
        if 0 < group < k:
            bk = min(bk, group & -group)  # the largest power of two dividing it (check_tiles keeps it >= 16)
    return bk


def quantized_input(x: torch.Tensor, act_group: int, fuse_tile: int | None = None):
    """(activation, its scales, ACT mode) for a GEMM over x [M, K]: as it is (act_group 0; the scales a placeholder
    pointer), quantized in the kernel (mode 2) where fuse_tile (the GEMV's BLOCK_K) is exactly one group, else
    quantized first by fp8_quantize_rows (mode 1)."""
    k = x.shape[1]
    if act_group == 0:
        return x, x.new_empty((1, 1), dtype=torch.float32), 0
    if fuse_tile is not None and (fuse_tile == act_group or (act_group >= k and fuse_tile >= k)):
        return x, x.new_empty((1, 1), dtype=torch.float32), 2
    return (*fp8_quantize_rows(x, act_group), 1)


def fp8_moe_gemv(hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, block_k, act_group,
                 cfg) -> torch.Tensor:
    """fp8_fused_moe's contract (arguments checked by the caller); cfg: fp8_moe_config's gemv dict."""
    (t, h), inter, top_k = hidden.shape, w13.shape[1] // 2, topk_ids.shape[1]
    num_experts = w13.shape[0]
    out = torch.empty_like(hidden)
    act = torch.empty((t * top_k, inter), dtype=hidden.dtype, device=hidden.device)
    launch = pdl(hidden.device)
    bn, bk, warps = cfg["up"]
    bk = k_tile(bk, h, block_k, act_group)
    x, xs, mode = quantized_input(hidden, act_group, bk)
    _fp8_gate_up_gemv_kernel[(t * top_k, triton.cdiv(inter, bn))](
        x, xs, w13, w13_scale, topk_ids, act, num_experts, h, inter, top_k, x.stride(0), w13.stride(0),
        w13.stride(1), w13_scale.stride(0), w13_scale.stride(1), block_k, max(act_group, 1), xs.shape[-1],
        BLOCK_N=bn, BLOCK_K=bk, ACT=mode, num_warps=warps, **launch)
    bn, bk, warps = cfg["down"]
    bk = k_tile(bk, inter, block_k, act_group)
    a, a_scale, mode = quantized_input(act, act_group, bk)
    _fp8_down_gemv_sum_kernel[(t, triton.cdiv(h, bn))](
        a, a_scale, w2, w2_scale, topk_ids, topk_weights, out, num_experts, h, inter, w2.stride(0), w2.stride(1),
        w2_scale.stride(0), w2_scale.stride(1), block_k, max(act_group, 1), a_scale.shape[-1], TOP_K=top_k,
        K_PAD=pow2(top_k), BLOCK_N=bn, BLOCK_K=bk, ACT=mode, num_warps=warps, **launch)
    return out
