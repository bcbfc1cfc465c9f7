"""Decode attention (one new token per sequence): split-KV flash-decoding, GQA-grouped, longest first.

Grid (kv_heads, num_splits, num_seqs): one program holds all query heads of one KV head ([G_PAD, D_PAD] so
K/V are read once per KV head) and walks one contiguous split of one sequence's context. With more than
one split, a second kernel merges the per-split partial outputs by their log-sum-exp. Sequences whose query
length is not 1 are left to the prefill kernel (their programs exit at once). The split count only tunes
parallelism: every split size is derived in-kernel from the real seq_len, so a grid sized from a stale
max_seq_len hint (e.g. under a CUDA graph) still covers every key.

Launch order: the GPU starts programs in grid order, and the sequences are its slowest axis, so all programs
of one sequence start together; with `order` (a permutation of the sequences, longest first, made once a step:
decode_order) the longest start first and the short ones fill the gaps at the end. A batch of mixed context
lengths otherwise ends with a tail wave of long sequences on a part of the SMs (measured gains:
docs/kernels/attention.md). Any permutation gives the same result: the order only moves time.

fp8 (e4m3) caches are dequantised by the per-tensor scales applied to the scores (k_scale) and to the
output (v_scale), never per element; per element there is only the dtype conversion for the tensor-core
dots. With bf16 queries those dots run in fp16: on sm_90 e4m3 -> fp16 is one conversion per two elements
(F2FP), e4m3 -> bf16 goes through fp16 and adds one quarter-rate F2F per element, which bounded the fp8
kernel (fewer instructions per tile in fp16, ptxas). fp16 holds e4m3 exactly and P in [0, 1] more
precisely than bf16; the query is scaled by softmax_scale * log2(e) first, which keeps it in fp16's range.
V_REGS (option, off by default): V tiles are loaded into registers one tile ahead and converted to fp16
before the dot, which then reads them from shared memory with ldmatrix.trans; left to the pipeliner, fp8 V
sits in shared memory as bytes and P @ V gathers them with one LDS.U8 per element (V is key-major, the dot
reduces over keys). Fewer instructions, but not faster in the sweep (docs/kernels/attention.md).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from atom_kernels.reference.attention import step_memo
from atom_kernels.triton._utils import check, pdl, pdl_prologue, pow2
from atom_kernels.triton.attention.common import attend_tile, load_block_ids, load_kv_tile


# Not specialized: window (a compile-time 1 would turn the mask logic into Python bools), and what changes step
# to step (num_splits, the block table's row stride, the addresses of slices of the host's step buffers), which
# Triton would otherwise compile a variant for per value equal to 1 / divisible by 16 or per 16-byte alignment.
@triton.jit(do_not_specialize=["window", "num_splits", "ordered", "s_bt", "qsl_ptr", "seq_lens_ptr", "bt_ptr",
                               "order_ptr"])
def _decode_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, order_ptr, k_scale_ptr, v_scale_ptr, out_ptr, po_ptr,
    plse_ptr, qk_scale, window, num_splits, ordered,
    sq_t, sq_h, sq_d, so_t, so_h, so_d, s_bt, s_btc,
    skc_b, skc_t, skc_h, skc_d, svc_b, svc_t, svc_h, svc_d,
    HEAD_DIM, GROUP, NUM_HEADS,
    BLOCK_SIZE: tl.constexpr, G_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_SCALE: tl.constexpr, SPLIT: tl.constexpr, DOT_F16: tl.constexpr, V_REGS: tl.constexpr, PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    seq = tl.program_id(2)  # the launch-order rank; the sequence itself when not ordered (a runtime flag: one variant)
    seq = tl.where(ordered != 0, tl.load(order_ptr + seq, mask=ordered != 0, other=0), seq)
    q_start = tl.load(qsl_ptr + seq).to(tl.int64)
    if tl.load(qsl_ptr + seq + 1) - q_start != 1:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    # The query at position seq_len - 1 sees keys >= seq_len - window (window 0: all keys).
    lo = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    g = tl.arange(0, G_PAD)
    heads = kvh * GROUP + g
    d = tl.arange(0, D_PAD)
    d_mask = d < HEAD_DIM
    qg_mask = (g < GROUP)[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + q_start * sq_t + heads[:, None] * sq_h + d[None, :] * sq_d, mask=qg_mask, other=0.0)
    qk = qk_scale
    if DOT_F16:  # fp8 K/V, bf16 q: dots in fp16 (see the module docstring); q pre-scaled into fp16's range
        q = (q.to(tl.float32) * qk_scale).to(tl.float16)
        qk = 1.0
    if HAS_SCALE:
        qk = qk * tl.load(k_scale_ptr).to(tl.float32)
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    den = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    k_off = kvh.to(tl.int64) * skc_h
    v_off = kvh.to(tl.int64) * svc_h
    n = start + tl.arange(0, BLOCK_N)
    blk = load_block_ids(bt_row, s_btc, n, n < end, BLOCK_SIZE)
    if V_REGS:  # V one tile ahead in registers (K still pipelined through shared memory)
        v = load_kv_tile(vc_ptr, blk, n, n < end, v_off, svc_b, svc_t, svc_d, d, d_mask, BLOCK_SIZE)
        for n0 in range(start, end, BLOCK_N):  # every tile holds >= 1 valid key, so m stays finite
            n = n0 + tl.arange(0, BLOCK_N)
            n_mask = n < end
            n_next = n + BLOCK_N
            blk_next = load_block_ids(bt_row, s_btc, n_next, n_next < end, BLOCK_SIZE)
            k = load_kv_tile(kc_ptr, blk, n, n_mask, k_off, skc_b, skc_t, skc_d, d, d_mask, BLOCK_SIZE)
            v_next = load_kv_tile(vc_ptr, blk_next, n_next, n_next < end, v_off, svc_b, svc_t, svc_d, d, d_mask,
                                  BLOCK_SIZE)
            m, den, acc = attend_tile(q, k, v.to(q.dtype), n_mask[None, :], m, den, acc, qk)
            v = v_next
            blk = blk_next
    else:
        for n0 in range(start, end, BLOCK_N):  # every tile holds >= 1 valid key, so m stays finite
            n = n0 + tl.arange(0, BLOCK_N)
            n_mask = n < end
            blk_next = load_block_ids(bt_row, s_btc, n + BLOCK_N, n + BLOCK_N < end, BLOCK_SIZE)
            k = load_kv_tile(kc_ptr, blk, n, n_mask, k_off, skc_b, skc_t, skc_d, d, d_mask, BLOCK_SIZE)
            v = load_kv_tile(vc_ptr, blk, n, n_mask, v_off, svc_b, svc_t, svc_d, d, d_mask, BLOCK_SIZE)
            m, den, acc = attend_tile(q, k, v, n_mask[None, :], m, den, acc, qk)
            blk = blk_next
    if HAS_SCALE:
        acc = acc * tl.load(v_scale_ptr).to(tl.float32)
    o = acc / tl.where(den > 0, den, 1.0)[:, None]
    if SPLIT:  # partials [num_seqs, heads, num_splits, HEAD_DIM] and their lse [num_seqs, heads, num_splits]
        row = (seq * NUM_HEADS + heads).to(tl.int64) * num_splits + split
        tl.store(po_ptr + row[:, None] * HEAD_DIM + d[None, :], o, mask=qg_mask)
        lse = tl.where(den > 0, m + tl.log2(den), float("-inf"))
        tl.store(plse_ptr + row, lse, mask=g < GROUP)
    else:
        out = out_ptr + q_start * so_t + heads[:, None] * so_h + d[None, :] * so_d
        tl.store(out, o.to(out_ptr.dtype.element_ty), mask=qg_mask)


@triton.jit(do_not_specialize=["num_splits", "qsl_ptr"])  # as in _decode_kernel
def _merge_kernel(
    qsl_ptr, po_ptr, plse_ptr, out_ptr, num_splits, so_t, so_h, so_d, HEAD_DIM, NUM_HEADS,
    S_PAD: tl.constexpr, D_PAD: tl.constexpr, PDL: tl.constexpr,
):
    # Grid (num_seqs, heads): out = sum_s 2^(lse_s - max) * o_s / sum_s 2^(lse_s - max).
    pdl_prologue(PDL)
    seq = tl.program_id(0)
    h = tl.program_id(1)
    q_start = tl.load(qsl_ptr + seq).to(tl.int64)
    if tl.load(qsl_ptr + seq + 1) - q_start != 1:
        return
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D_PAD)
    row = (seq * NUM_HEADS + h).to(tl.int64) * num_splits + s
    lse = tl.load(plse_ptr + row, mask=s < num_splits, other=float("-inf"))
    mx = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(mx == float("-inf"), 0.0, mx))  # 0 for empty splits
    mask = (s < num_splits)[:, None] & (d < HEAD_DIM)[None, :]
    o = tl.load(po_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=mask, other=0.0)
    total = tl.sum(w, 0)
    res = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    out = out_ptr + q_start * so_t + h * so_h + d * so_d
    tl.store(out, res.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


@functools.cache
def num_sms(device: torch.device) -> int:
    if device.type != "cuda":  # the interpreter (TRITON_INTERPRET=1) on CPU tensors
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


# Split-count target: programs per SM. ptxas (sm_90, head_dim 128) allows 3 resident programs of the 16-bit
# config below and 2 of the fp8 one, but two per SM already saturate HBM; filling 3 slots by splitting more was
# no faster (docs/kernels/attention.md).
PROGRAMS_PER_SM = 2


def decode_slots(device) -> int:
    """Decode programs the split count and the launch order plan for at once: PROGRAMS_PER_SM on every SM."""
    return PROGRAMS_PER_SM * num_sms(device)


def decode_config(num_seqs: int, kv_heads: int, max_seq_len: int, head_dim: int, device,
                  cache_dtype=torch.bfloat16, query_dtype=torch.bfloat16) -> dict:
    """Tile, warps, pipeline depth by dtype, and the split count (sweeps: benchmarks/attention_decode.py).

    fp8 takes 128-key tiles (the bytes of a 16-bit 64-key tile) with 3 stages: the fastest in the sweep on all
    three benchmark shapes (docs/kernels/attention.md). V through registers (v_regs) was faster on one shape
    only, so it stays off.
    """
    fp8 = cache_dtype.itemsize == 1
    block_n = 32 if query_dtype == torch.float32 or head_dim > 128 else (128 if fp8 else 64)
    splits = pick_splits(num_seqs * kv_heads, decode_slots(device), triton.cdiv(max(max_seq_len, 1), 512))
    return dict(num_splits=splits, block_n=block_n, num_warps=4, num_stages=3, v_regs=False)


@functools.lru_cache(maxsize=4096)  # called per layer and step with few distinct arguments; the loop is Python
def pick_splits(programs: int, slots: int, max_splits: int) -> int:
    """Split only to fill an under-occupied GPU; pick the count whose last wave wastes least.

    Time ~ waves / splits with waves = ceil(programs * splits / slots) (equal work per program). A
    wave that is only slightly over full nearly doubles the time (docs/kernels/attention.md), so a count
    must win by 5% over a smaller one.
    """
    if programs >= slots:
        return 1
    best, best_t = 1, 1.0
    for s in range(2, min(max_splits, 64) + 1):
        t = triton.cdiv(programs * s, slots) / s
        if t < 0.95 * best_t:
            best, best_t = s, t
    return best


def decode_order(seq_lens: torch.Tensor, programs_per_seq: int, slots: int, plan_cache: dict | None):
    """The launch order for a decode grid whose slowest axis is the sequences (_decode_kernel, the MLA decode
    kernels): sequence indices longest first (int32, on the device, no device sync), made once a step (memo in
    plan_cache, the metadata's per-step memo; every decode kernel of the step shares it). None where the grid's programs
    fit in one wave of `slots` resident programs (the order cannot matter there) or there is no step to share it
    with (a sort per call would cost more than it saves)."""
    num_seqs = seq_lens.shape[0]
    if plan_cache is None or num_seqs * programs_per_seq <= slots:
        return None
    return step_memo(plan_cache, ("triton.decode_order", seq_lens.data_ptr(), num_seqs),
                     lambda: torch.argsort(seq_lens, descending=True).to(torch.int32))


def order_args(order: torch.Tensor | None, seq_lens: torch.Tensor) -> tuple:
    """The decode kernels' (order_ptr, ordered) arguments: decode_order's permutation and 1, or, for batch order, any
    int32 pointer (never read) and 0; `ordered` is a runtime flag, so both run one compiled variant."""
    return (seq_lens if order is None else order), int(order is not None)


def check_grid_seqs(num_seqs: int) -> None:
    """The decode grids put the sequences on their third axis, which CUDA caps at 65535."""
    check(num_seqs < 65536, f"{num_seqs} decode sequences in one batch; at most 65535 (the decode grid's third "
                            "axis): split the batch")


def launch_decode(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, qk_scale, window,
                  k_scale, v_scale, out, num_splits, block_n, num_warps, num_stages, v_regs=False,
                  f16_dots=True, maxnreg=None, order=None) -> None:
    """Run the decode kernel (+ merge) for the one-token sequences of the batch; arguments pre-checked.

    v_regs: V tiles through registers (see the module docstring; meant for fp8 caches). f16_dots=False keeps
    bf16 dots for fp8 caches with bf16 queries (the former path, for comparison). maxnreg: a register
    cap per thread (ptxas), to fit more programs per SM. order: decode_order's permutation (None: batch order).
    """
    num_seqs = seq_lens.shape[0]
    check_grid_seqs(num_seqs)
    _, heads, head_dim = query.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    split = num_splits > 1
    po = plse = out
    if split:
        po = torch.empty((num_seqs, heads, num_splits, head_dim), dtype=torch.float32, device=query.device)
        plse = torch.empty((num_seqs, heads, num_splits), dtype=torch.float32, device=query.device)
    scaled = k_scale is not None
    launch = pdl(query.device)
    order_ptr, ordered = order_args(order, seq_lens)
    _decode_kernel[(kv_heads, num_splits, num_seqs)](
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, order_ptr,
        k_scale if scaled else query, v_scale if scaled else query, out, po, plse,
        qk_scale, window, num_splits, ordered, *query.stride(), *out.stride(), *block_tables.stride(),
        *k_cache.stride(), *v_cache.stride(), head_dim, group, heads,
        BLOCK_SIZE=k_cache.shape[1], G_PAD=pow2(group, 16), D_PAD=pow2(head_dim, 16), BLOCK_N=block_n,
        HAS_SCALE=scaled, SPLIT=split, V_REGS=v_regs,
        DOT_F16=f16_dots and k_cache.dtype.itemsize == 1 and query.dtype == torch.bfloat16,
        num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}), **launch,
    )
    if split:
        _merge_kernel[(num_seqs, heads)](
            query_start_loc, po, plse, out, num_splits, *out.stride(), head_dim, heads,
            S_PAD=pow2(num_splits), D_PAD=pow2(head_dim, 16), **launch,
        )
