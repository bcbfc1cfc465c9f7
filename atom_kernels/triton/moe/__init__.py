"""fused_moe (Triton): the experts of a MoE layer as two grouped GEMMs over expert-aligned blocks of tokens
(below: from a few tokens per expert to prefill; fewer pairs than half the experts go to moe/gemv.py).

Same contract and arithmetic as the torch reference (atom_kernels.reference.moe.fused_moe), -1 ids included (expert
parallelism: the pair's expert is on another rank, the pair contributes nothing); any id outside [0, E) is dropped so,
unchecked (a check would sync the host):
  1. moe_align groups the (token, k) pairs by expert into BLOCK_M-row blocks (moe/align.py), on the GPU;
  2. gate/up GEMM: each program multiplies one block's gathered token rows by BLOCK_N gate columns and the
     same BLOCK_N up columns of its expert's w13 (two fp32 accumulators), then applies SiLU-and-mul and
     stores act [pairs, I] (rounded like the reference: gate, up, silu(gate), product each to the dtype);
  3. down GEMM: act rows of the block @ w2[e]^T, rounded, times the routing weight (cast to the dtype, as
     the reference does), stored per pair: y [pairs, H];
  4. the sum over top-k: one small kernel adds each token's K rows of y in fp32 and rounds once.
No atomics: a pair's output row is written once, so results do not depend on scheduling (atomic adds into
[T, H] would need a zeroed fp32 buffer and a cast pass anyway, and vary run to run). A dedicated kernel
rather than y.view(T, K, H).sum(1), because it also skips pairs whose expert id is out of range, -1 above all
(which moe_align drops and whose y rows are never written); it is one launch either way.

Grids are sized from shapes (moe_align.max_blocks); programs of blocks past the device-side row count exit
at once. No host sync anywhere, so one call is CUDA-graph capturable and can be replayed with other routing.
Programs are ordered in groups of GROUP_M blocks (all N tiles of a group run together) so a block's token
rows and consecutive blocks of one expert share weight tiles in L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.reference.moe import check_moe_args
from atom_kernels.triton._utils import (
    FLOAT_DTYPES,
    check,
    check_dtype,
    check_same_device,
    pdl,
    pdl_prologue,
    powers_of_two_up_to,
)
from atom_kernels.triton.activation import silu_mul
from atom_kernels.triton.moe.align import max_blocks, moe_align
from atom_kernels.triton.moe.gemv import fused_moe_gemv

# Up to this many tokens moe_config's tiles and moe_align's chunk change on joint bounds: warmed one count at a time.
_DENSE_WARM_UP_TOKENS = 512


def warm_up_shapes(max_tokens: int) -> list[int]:
    """Token counts reaching every variant fused_moe compiles for steps of up to max_tokens tokens: 1, 2, ..., 512,
    then the powers of two above (moe_config's tiles and the alignment's chunk are power-of-two bucketed there) and
    max_tokens itself. tests/kernels/test_kernel_warmup.py checks them against moe_config and moe_align."""
    dense = list(range(1, min(max_tokens, _DENSE_WARM_UP_TOKENS) + 1))
    if max_tokens <= _DENSE_WARM_UP_TOKENS:
        return dense
    return dense + powers_of_two_up_to(max_tokens, 2 * _DENSE_WARM_UP_TOKENS)


def moe_config(num_tokens: int, top_k: int, num_experts: int, dtype: torch.dtype) -> dict:
    """Kernels and tiles from the average rows per expert (known from shapes alone, so graph-safe).
    At most one pair per two experts (decode): the GEMV kernels (moe/gemv.py), no grouping; BLOCK_N rows of
    BLOCK_K-wide tiles per program, narrow so even one pair spreads over every SM.
    Few rows: every expert touched is one mostly-padded block and the GEMMs stream weights, so the
    tiles are narrow in N (many programs, several per SM, deep pipelines keep bytes in flight). Many rows
    (prefill): compute-bound; 128-row blocks with 256-column tiles (gate + up: 2 x 128; down: 256) feed the tensor cores
    (wgmma on Hopper needs BLOCK_M >= 64), 3-4 stages hide the gathered row loads."""
    rows = num_tokens * top_k / num_experts
    if rows <= 0.5:
        bk = 128 if dtype == torch.float32 else 256  # down: a [top_k, BLOCK_N, BLOCK_K/2] tile per step
        return dict(gemv=True, up=(16, bk, 4), down=(4, bk // 2, 4))  # (BLOCK_N, BLOCK_K, num_warps)
    if rows <= 4:
        cfg = dict(block_m=16, up=(32, 128, 4, 4), down=(64, 128, 4, 4))
    elif rows <= 32:
        cfg = dict(block_m=32, up=(32, 128, 4, 4), down=(64, 128, 4, 4))
    elif rows <= 96:
        cfg = dict(block_m=64, up=(64, 64, 4, 4), down=(128, 64, 4, 4))
    else:  # (the fastest of benchmarks/moe.py --sweep at 4096 tokens: docs/kernels/moe.md)
        cfg = dict(block_m=128, up=(128, 64, 8, 3), down=(256, 64, 8, 3))
    if dtype == torch.float32:  # no tensor cores (exact fp32 products): <= 64-row blocks (128 spill registers),
        # twice the bytes per element: half the BLOCK_K, at most 3 stages
        cfg = {k: min(v, 64) if k == "block_m" else (v[0], v[1] // 2, v[2], min(v[3], 3)) for k, v in cfg.items()}
    return cfg  # up/down: (BLOCK_N, BLOCK_K, num_warps, num_stages)


@triton.jit
def _tile(num_m, N, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(block, first column) of this program: GROUP_M consecutive blocks share each column tile."""
    pid = tl.program_id(0)
    per_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = pid // per_group * GROUP_M
    size = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % size, (pid % per_group) // size * BLOCK_N


@triton.jit
def _block_pairs(sorted_ptr, expert_ids_ptr, pid_m, num_pairs, BLOCK_M: tl.constexpr):
    """(pair ids [BLOCK_M], which are real rather than padding, the block's expert)."""
    pair = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    return pair, pair < num_pairs, tl.load(expert_ids_ptr + pid_m).to(tl.int64)


@triton.jit(do_not_specialize=["num_pairs", "num_m"])  # token counts: no recompiles per step
def _gate_up_kernel(x_ptr, w_ptr, sorted_ptr, expert_ids_ptr, post_pad_ptr, act_ptr,
                    num_pairs, top_k, H, INTER, num_m, sx, sw_e, sw_n, sw_k,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    EVEN_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    # grid (max_blocks * cdiv(INTER, BLOCK_N),): act[pair, n] = silu(x[tok] . w13[e, n]) * (x[tok] . w13[e, INTER + n])
    pdl_prologue(PDL)
    pid_m, n0 = _tile(num_m, INTER, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(post_pad_ptr):  # past the rows in use (the grid is a bound)
        return
    pair, valid, e = _block_pairs(sorted_ptr, expert_ids_ptr, pid_m, num_pairs, BLOCK_M)
    tok = tl.where(valid, pair // top_k, 0)  # padding rows read token 0; they are never stored
    n = (n0 + tl.arange(0, BLOCK_N)) % INTER  # wrapped columns keep the loads in bounds; stores are masked
    k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tok.to(tl.int64)[:, None] * sx + k[None, :]
    g_ptrs = w_ptr + e * sw_e + n[None, :] * sw_n + k[:, None] * sw_k  # [BLOCK_K, BLOCK_N] of w13[e]^T
    u_ptrs = g_ptrs + INTER * sw_n
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        if EVEN_K:
            a, g, u = tl.load(a_ptrs), tl.load(g_ptrs), tl.load(u_ptrs)
        else:
            km = k < H - k0
            a = tl.load(a_ptrs, mask=km[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=km[:, None], other=0.0)
            u = tl.load(u_ptrs, mask=km[:, None], other=0.0)
        acc_g = tl.dot(a, g, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, u, acc_u, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K * sw_k
        u_ptrs += BLOCK_K * sw_k
    store_silu_mul(act_ptr, acc_g, acc_u, pair, valid, n0, INTER, BLOCK_N)


@triton.jit
def store_silu_mul(act_ptr, acc_g, acc_u, pair, valid, n0, INTER, BLOCK_N: tl.constexpr):
    """act[pair, n0:n0 + BLOCK_N] = silu(gate) * up of fp32 accumulators [BLOCK_M, BLOCK_N], each rounded to act's
    dtype first as the reference rounds its matmul outputs; padding rows (valid False) and columns >= INTER unstored."""
    dtype = act_ptr.dtype.element_ty
    gate = acc_g.to(dtype).to(tl.float32)
    up = acc_u.to(dtype).to(tl.float32)
    cols = n0 + tl.arange(0, BLOCK_N)
    out = act_ptr + pair.to(tl.int64)[:, None] * INTER + cols[None, :]
    tl.store(out, silu_mul(gate, up, dtype), mask=valid[:, None] & (cols < INTER)[None, :])


@triton.jit(do_not_specialize=["num_pairs", "num_m"])  # token counts: no recompiles per step
def _down_kernel(act_ptr, w_ptr, sorted_ptr, expert_ids_ptr, post_pad_ptr, weights_ptr, y_ptr,
                 num_pairs, H, INTER, num_m, sw_e, sw_n, sw_k,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 EVEN_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    # grid (max_blocks * cdiv(H, BLOCK_N),): y[pair, n] = weight[pair] * (act[pair] . w2[e, n])
    pdl_prologue(PDL)
    pid_m, n0 = _tile(num_m, H, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(post_pad_ptr):  # past the rows in use (the grid is a bound)
        return
    pair, valid, e = _block_pairs(sorted_ptr, expert_ids_ptr, pid_m, num_pairs, BLOCK_M)
    src = tl.where(valid, pair, 0).to(tl.int64)
    n = (n0 + tl.arange(0, BLOCK_N)) % H
    k = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + src[:, None] * INTER + k[None, :]
    b_ptrs = w_ptr + e * sw_e + n[None, :] * sw_n + k[:, None] * sw_k  # [BLOCK_K, BLOCK_N] of w2[e]^T
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        if EVEN_K:
            a, b = tl.load(a_ptrs), tl.load(b_ptrs)
        else:
            km = k < INTER - k0
            a = tl.load(a_ptrs, mask=km[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=km[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * sw_k
    dtype = y_ptr.dtype.element_ty
    w = tl.load(weights_ptr + src).to(dtype).to(tl.float32)
    y = (acc.to(dtype).to(tl.float32) * w[:, None]).to(dtype)
    cols = n0 + tl.arange(0, BLOCK_N)
    tl.store(y_ptr + src[:, None] * H + cols[None, :], y, mask=valid[:, None] & (cols < H)[None, :])


@triton.jit
def _sum_topk_kernel(y_ptr, ids_ptr, out_ptr, H, E, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    # grid (T, cdiv(H, BLOCK_H)): out[t] = sum_k y[t * K + k] in fp32, skipping pairs moe_align dropped.
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = h < H
    acc = tl.zeros([BLOCK_H], tl.float32)
    for k in tl.static_range(TOP_K):
        e = tl.load(ids_ptr + t * TOP_K + k)
        ok = (e >= 0) & (e < E)
        acc += tl.load(y_ptr + (t * TOP_K + k) * H + h, mask=hm & ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + h, acc.to(out_ptr.dtype.element_ty), mask=hm)


def _check(hidden, w13, w2, topk_weights, topk_ids) -> None:
    check_moe_args(hidden, w13, w2, topk_weights, topk_ids)
    check_dtype("fused_moe: hidden", hidden, FLOAT_DTYPES)
    check(w13.dtype == hidden.dtype and w2.dtype == hidden.dtype,
          f"fused_moe: w13 ({w13.dtype}) and w2 ({w2.dtype}) must have hidden's dtype ({hidden.dtype})")
    check_same_device(hidden=hidden, w13=w13, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids)
    check(hidden.stride(-1) == 1, f"fused_moe: hidden needs a contiguous last dim, got strides {hidden.stride()}")
    check(topk_ids.is_contiguous() and topk_weights.is_contiguous(),
          "fused_moe: topk_ids and topk_weights must be contiguous (call .contiguous())")


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """hidden [T, H]; w13 [E, 2*I, H] (gate rows then up rows); w2 [E, H, I]; topk_weights [T, K] float;
    topk_ids [T, K] int (-1: an expert of another rank, skipped) → [T, H] in hidden's dtype. config: moe_config's
    dict (default: chosen from T)."""
    _check(hidden, w13, w2, topk_weights, topk_ids)
    (t, h), (num_experts, two_i, _), top_k = hidden.shape, w13.shape, topk_ids.shape[1]
    inter = two_i // 2
    out = torch.empty_like(hidden)
    if t == 0:
        return out
    cfg = config or moe_config(t, top_k, num_experts, hidden.dtype)
    if cfg.get("gemv"):
        return fused_moe_gemv(hidden, w13, w2, topk_weights, topk_ids, cfg)
    block_m, pairs = cfg["block_m"], t * top_k
    sorted_ids, expert_ids, post_pad = moe_align(topk_ids, num_experts, block_m)
    num_m = max_blocks(pairs, num_experts, block_m)
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"  # fp32: exact products, as the reference
    act = torch.empty((pairs, inter), dtype=hidden.dtype, device=hidden.device)
    launch = pdl(hidden.device)
    bn, bk, warps, stages = cfg["up"]
    _gate_up_kernel[(num_m * triton.cdiv(inter, bn),)](
        hidden, w13, sorted_ids, expert_ids, post_pad, act, pairs, top_k, h, inter, num_m, hidden.stride(0),
        *w13.stride(), BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EVEN_K=h % bk == 0,
        PRECISION=precision, num_warps=warps, num_stages=stages, **launch)
    y = torch.empty((pairs, h), dtype=hidden.dtype, device=hidden.device)
    bn, bk, warps, stages = cfg["down"]
    _down_kernel[(num_m * triton.cdiv(h, bn),)](
        act, w2, sorted_ids, expert_ids, post_pad, topk_weights, y, pairs, h, inter, num_m, *w2.stride(),
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EVEN_K=inter % bk == 0, PRECISION=precision,
        num_warps=warps, num_stages=stages, **launch)
    block_h = min(triton.next_power_of_2(h), 1024)
    _sum_topk_kernel[(t, triton.cdiv(h, block_h))](y, topk_ids, out, h, num_experts, TOP_K=top_k,
                                                    BLOCK_H=block_h, **launch)
    return out
