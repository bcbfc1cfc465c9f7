"""fp8_fused_moe (Triton): the experts of a MoE layer on e4m3 weights with per-row, per-K-block float32 scales.

Contract and numerics: atom_kernels.reference.fp8.fp8_fused_moe (w13 [E, 2I, H] / w2 [E, H, I] float8_e4m3fn,
scales [E, 2I, ceil(H / block_k)] / [E, H, ceil(I / block_k)]; each GEMM's input quantized per token and group of
act_group columns, or not at all for act_group 0). The structure is fused_moe's (moe/__init__.py): moe_align, a
gate/up GEMM over expert-aligned blocks with SiLU-and-mul, a down GEMM times the routing weight, the top-k sum; few
pairs take the GEMVs of moe/fp8_gemv.py. What fp8 changes:
  - Both scales are constant over a K tile (k_tile keeps tiles inside one weight-scale block and one activation
    group), so a tile's product factors: sum_k xq[m, k] w[n, k] * xs[m] * ws[n]. Each tile is one tl.dot of the
    e4m3 operands (Hopper/Ada fp8 tensor cores; float16 conversions, exact, on other GPUs and for K tiles under 32)
    and its fp32 result times the outer product of the scales is added to an fp32 accumulator, DeepSeek's recipe:
    the tensor cores' limited-precision fp8 accumulation never runs past one tile.
  - Weights only (act_group 0): the activation in its dtype against the e4m3 tile converted to that dtype (exact),
    times the weight scales; fp32 activations with exact ("ieee") products, as the reference's fp32 matmul.
  - Dynamic activations: the hidden rows and the SiLU-and-mul output are quantized by fp8_quantize_rows (bit-equal
    to the reference's fp8_quantize) before each GEMM; the GEMMs read e4m3 activations (half the bytes).
  - The intermediate act [pairs, I] is rounded to the model dtype before its quantization, as the reference does.
Pairs whose expert id lies outside [0, E) (-1: an expert held by another rank) contribute nothing: moe_align drops
them and the top-k sum skips them. No host sync, grids from shapes: CUDA-graph capturable like fused_moe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.reference.moe import check_moe_args
from atom_kernels.triton._utils import FLOAT_DTYPES, check, check_dtype, check_same_device, pdl, pdl_prologue
from atom_kernels.triton.fp8_quant import use_fp8_dot
from atom_kernels.triton.moe import _block_pairs, _sum_topk_kernel, _tile, moe_config, store_silu_mul
from atom_kernels.triton.moe import warm_up_shapes as warm_up_shapes  # same tile buckets as fused_moe
from atom_kernels.triton.moe.align import max_blocks, moe_align
from atom_kernels.triton.moe.fp8_gemv import fp8_moe_gemv, k_tile, quantized_input

FP8 = torch.float8_e4m3fn


def fp8_moe_config(num_tokens: int, top_k: int, num_experts: int, dtype: torch.dtype, act_group: int) -> dict:
    """moe_config's kernels and buckets (so fused_moe's warm_up_shapes reach every variant), with fp8 tiles: the GEMVs
    read 128-column e4m3 tiles (one fp8 block); the block GEMMs on e4m3 activations take 128-deep K tiles (the bytes
    of a 64-deep bf16 tile). Untuned on a GPU so far (docs/fp8.md)."""
    base = moe_config(num_tokens, top_k, num_experts, dtype if act_group == 0 else torch.bfloat16)
    if base.get("gemv"):
        return dict(gemv=True, up=(32, 128, 4), down=(8, 128, 4))  # (BLOCK_N, BLOCK_K, num_warps)
    if act_group:
        base = {k: v if k == "block_m" else (v[0], max(v[1], 128), v[2], v[3]) for k, v in base.items()}
    return base  # up/down: (BLOCK_N, BLOCK_K, num_warps, num_stages)


@triton.jit
def _tile_dot(a, b, ACT: tl.constexpr, FP8_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """a [BLOCK_M, BLOCK_K] (ACT 0: the activation dtype; 1: e4m3) @ b [BLOCK_K, BLOCK_N] e4m3 → fp32."""
    if ACT == 0:
        return tl.dot(a, b.to(a.dtype), input_precision=PRECISION)  # every e4m3 value is exact in bf16/fp16/fp32
    elif FP8_DOT:
        return tl.dot(a, b)
    else:
        return tl.dot(a.to(tl.float16), b.to(tl.float16))  # exact conversions, exact products


@triton.jit(do_not_specialize=["num_pairs", "num_m"])  # token counts: no recompiles per step
def _fp8_gate_up_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, sorted_ptr, expert_ids_ptr, post_pad_ptr, act_ptr,
                        num_pairs, top_k, H, INTER, num_m, sx, sw_e, sw_n, ss_e, ss_n, block_k, GROUP, G_X,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        ACT: tl.constexpr, FP8_DOT: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    # grid (max_blocks * cdiv(INTER, BLOCK_N),): act[pair, n] = silu(x[tok] . w13[e, n]) * (x[tok] . w13[e, INTER + n])
    # x [T, H] (ACT 1: e4m3 with xs [T, G_X]), w13 [E, 2I, H] e4m3 with ws [E, 2I, ceil(H / block_k)].
    pdl_prologue(PDL)
    pid_m, n0 = _tile(num_m, INTER, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(post_pad_ptr):  # past the rows in use (the grid is a bound)
        return
    pair, valid, e = _block_pairs(sorted_ptr, expert_ids_ptr, pid_m, num_pairs, BLOCK_M)
    tok = tl.where(valid, pair // top_k, 0).to(tl.int64)  # padding rows read token 0; they are never stored
    n = (n0 + tl.arange(0, BLOCK_N)) % INTER  # wrapped columns keep the loads in bounds; stores are masked
    k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tok[:, None] * sx + k[None, :]
    g_ptrs = w_ptr + e * sw_e + n[None, :] * sw_n + k[:, None]  # [BLOCK_K, BLOCK_N] of w13[e]^T (K-major)
    gs_ptrs = ws_ptr + e * ss_e + n * ss_n  # [BLOCK_N] gate scales (+ the K block); the up rows' are INTER rows on
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        km = k < H - k0
        a = tl.load(a_ptrs + k0, mask=km[None, :], other=0.0)
        g = tl.load(g_ptrs + k0, mask=km[:, None], other=0.0)
        u = tl.load(g_ptrs + INTER * sw_n + k0, mask=km[:, None], other=0.0)
        sg = tl.load(gs_ptrs + k0 // block_k)[None, :]
        su = tl.load(gs_ptrs + INTER * ss_n + k0 // block_k)[None, :]
        if ACT == 1:
            xs = tl.load(xs_ptr + tok * G_X + k0 // GROUP)[:, None]
            sg, su = xs * sg, xs * su
        acc_g += _tile_dot(a, g, ACT, FP8_DOT, PRECISION) * sg
        acc_u += _tile_dot(a, u, ACT, FP8_DOT, PRECISION) * su
    store_silu_mul(act_ptr, acc_g, acc_u, pair, valid, n0, INTER, BLOCK_N)


@triton.jit(do_not_specialize=["num_pairs", "num_m"])  # token counts: no recompiles per step
def _fp8_down_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, sorted_ptr, expert_ids_ptr, post_pad_ptr, weights_ptr, y_ptr,
                     num_pairs, H, INTER, num_m, sw_e, sw_n, ss_e, ss_n, block_k, GROUP, G_A,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     ACT: tl.constexpr, FP8_DOT: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    # grid (max_blocks * cdiv(H, BLOCK_N),): y[pair, n] = weight[pair] * (act[pair] . w2[e, n]), w2 dequantized;
    # act [pairs, I] (ACT 1: e4m3 with as [pairs, G_A]), w2 [E, H, I] e4m3 with ws [E, H, ceil(I / block_k)].
    pdl_prologue(PDL)
    pid_m, n0 = _tile(num_m, H, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(post_pad_ptr):  # past the rows in use (the grid is a bound)
        return
    pair, valid, e = _block_pairs(sorted_ptr, expert_ids_ptr, pid_m, num_pairs, BLOCK_M)
    src = tl.where(valid, pair, 0).to(tl.int64)
    n = (n0 + tl.arange(0, BLOCK_N)) % H
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + src[:, None] * INTER + k[None, :]
    b_ptrs = w_ptr + e * sw_e + n[None, :] * sw_n + k[:, None]  # [BLOCK_K, BLOCK_N] of w2[e]^T (K-major)
    s_ptrs = ws_ptr + e * ss_e + n * ss_n
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        km = k < INTER - k0
        a = tl.load(a_ptrs + k0, mask=km[None, :], other=0.0)
        b = tl.load(b_ptrs + k0, mask=km[:, None], other=0.0)
        s = tl.load(s_ptrs + k0 // block_k)[None, :]
        if ACT == 1:
            s = tl.load(as_ptr + src * G_A + k0 // GROUP)[:, None] * s
        acc += _tile_dot(a, b, ACT, FP8_DOT, PRECISION) * s
    dtype = y_ptr.dtype.element_ty
    w = tl.load(weights_ptr + src).to(dtype).to(tl.float32)
    y = (acc.to(dtype).to(tl.float32) * w[:, None]).to(dtype)
    cols = n0 + tl.arange(0, BLOCK_N)
    tl.store(y_ptr + src[:, None] * H + cols[None, :], y, mask=valid[:, None] & (cols < H)[None, :])


def _check(hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, block_k, act_group) -> None:
    check_moe_args(hidden, w13, w2, topk_weights, topk_ids)
    check_dtype("fp8_fused_moe: hidden", hidden, FLOAT_DTYPES)
    check(w13.dtype == FP8 and w2.dtype == FP8,
          f"fp8_fused_moe: w13 ({w13.dtype}) and w2 ({w2.dtype}) must be {FP8}")
    check(block_k >= 1 and act_group >= 0, f"fp8_fused_moe: need block_k >= 1 and act_group >= 0, got {block_k}, "
                                           f"{act_group}")
    (e, two_i, h), i = w13.shape, w2.shape[2]
    for name, group in (("block_k", block_k), ("act_group", act_group)):
        check(group % 16 == 0 or group >= max(h, i),
              f"fp8_fused_moe: {name}={group} must be a multiple of 16 or cover all of K (hidden {h}, "
              f"intermediate {i}): the kernels' K tiles lie inside one scale block")
    for name, s, shape in (("w13_scale", w13_scale, (e, two_i, -(-h // block_k))),
                           ("w2_scale", w2_scale, (e, h, -(-i // block_k)))):
        check(s.dtype == torch.float32 and tuple(s.shape) == shape and s.stride(-1) == 1,
              f"fp8_fused_moe: {name} must be float32 {shape} (block_k={block_k}) with a contiguous last dim, got "
              f"{s.dtype} {tuple(s.shape)} strides {s.stride()}")
    check(w13.stride(-1) == 1 and w2.stride(-1) == 1,
          f"fp8_fused_moe: w13 and w2 need a contiguous last dim, got strides {w13.stride()}, {w2.stride()}")
    check_same_device(hidden=hidden, w13=w13, w2=w2, w13_scale=w13_scale, w2_scale=w2_scale,
                      topk_weights=topk_weights, topk_ids=topk_ids)
    check(hidden.stride(-1) == 1, f"fp8_fused_moe: hidden needs a contiguous last dim, got strides {hidden.stride()}")
    check(topk_ids.is_contiguous() and topk_weights.is_contiguous(),
          "fp8_fused_moe: topk_ids and topk_weights must be contiguous (call .contiguous())")


def fp8_fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor,
                  w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, block_k: int,
                  act_group: int, config: dict | None = None) -> torch.Tensor:
    """The reference's contract → [T, H] in hidden's dtype. config: fp8_moe_config's dict (default: from T), plus
    optionally fp8_dot (False: the float16-conversion dot, as on GPUs without fp8 tensor cores)."""
    _check(hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, block_k, act_group)
    (t, h), (num_experts, two_i, _), top_k = hidden.shape, w13.shape, topk_ids.shape[1]
    inter = two_i // 2
    if t == 0:
        return torch.empty_like(hidden)
    cfg = config or fp8_moe_config(t, top_k, num_experts, hidden.dtype, act_group)
    if cfg.get("gemv"):
        return fp8_moe_gemv(hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, block_k, act_group, cfg)
    block_m, pairs = cfg["block_m"], t * top_k
    sorted_ids, expert_ids, post_pad = moe_align(topk_ids, num_experts, block_m)
    num_m = max_blocks(pairs, num_experts, block_m)
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"  # fp32: exact products, as the reference
    fp8_dot = cfg.get("fp8_dot", use_fp8_dot(hidden.device, hidden.dtype))
    launch = pdl(hidden.device)
    common = dict(GROUP_M=8, PRECISION=precision, **launch)
    act = torch.empty((pairs, inter), dtype=hidden.dtype, device=hidden.device)
    bn, bk, warps, stages = cfg["up"]
    bk = k_tile(bk, h, block_k, act_group)
    x, xs, mode = quantized_input(hidden, act_group)
    _fp8_gate_up_kernel[(num_m * triton.cdiv(inter, bn),)](
        x, xs, w13, w13_scale, sorted_ids, expert_ids, post_pad, act, pairs, top_k, h, inter, num_m, x.stride(0),
        w13.stride(0), w13.stride(1), w13_scale.stride(0), w13_scale.stride(1), block_k, max(act_group, 1),
        xs.shape[-1], BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, ACT=mode, FP8_DOT=fp8_dot and bk >= 32,
        num_warps=warps, num_stages=stages, **common)
    y = torch.empty((pairs, h), dtype=hidden.dtype, device=hidden.device)
    bn, bk, warps, stages = cfg["down"]
    bk = k_tile(bk, inter, block_k, act_group)
    a, a_scale, mode = quantized_input(act, act_group)
    _fp8_down_kernel[(num_m * triton.cdiv(h, bn),)](
        a, a_scale, w2, w2_scale, sorted_ids, expert_ids, post_pad, topk_weights, y, pairs, h, inter, num_m,
        w2.stride(0), w2.stride(1), w2_scale.stride(0), w2_scale.stride(1), block_k, max(act_group, 1),
        a_scale.shape[-1], BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, ACT=mode, FP8_DOT=fp8_dot and bk >= 32,
        num_warps=warps, num_stages=stages, **common)
    out = torch.empty_like(hidden)
    block_h = min(triton.next_power_of_2(h), 1024)
    _sum_topk_kernel[(t, triton.cdiv(h, block_h))](y, topk_ids, out, h, num_experts, TOP_K=top_k, BLOCK_H=block_h,
                                                    **launch)
    return out
