"""Causal varlen prefill attention over a paged cached prefix (chunked prefill, prefix caching), GQA-grouped.

Grid (T // BLOCK_Q + num_seqs, kv_heads). A program holds BLOCK_Q query tokens of one sequence and all GROUP
query heads that share one KV head, flattened into the M dimension of the tile: row r is token r // GROUP,
head kv_head * GROUP + r % GROUP, BLOCK_M = pow2 >= BLOCK_Q * GROUP rows (the spare rows, if GROUP is not a
power of two, are masked). So every K/V tile is read once per KV head, not once per query head, and the
score and P @ V dots run as one [BLOCK_M, BLOCK_N] tile (the same MMA shape as a per-head kernel with
BLOCK_M query rows), where a loop over the GROUP heads would hold GROUP accumulators or reload Q per head.
Rows of one token are adjacent, so for a contiguous [T, heads, d] query the Q tile is one contiguous span.

Query tiles are numbered without a host sync: sequence i's tiles start at tile id
query_start_loc[i] // BLOCK_Q + i, which leaves room for its cdiv(q_len, BLOCK_Q) tiles, and a program
finds its sequence by binary search over that increasing sequence of ids. Spare programs exit at once.
Sequence i's new queries sit at positions seq_len - q_len .. seq_len - 1 and attend causally (and within
the sliding window) over its whole cached context, new tokens included (written to the cache before the
call).
"""

from __future__ import annotations

import triton
import triton.language as tl

from atom_kernels.triton._utils import check, pdl, pdl_prologue, pow2
from atom_kernels.triton.attention.common import attend_tile, load_block_ids, load_kv_tile


@triton.jit
def _find_seq(qsl_ptr, pid, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest i in [0, num_seqs) with query_start_loc[i] // BLOCK_Q + i <= pid."""
    lo = pid * 0
    hi = lo + num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = tl.load(qsl_ptr + mid) // BLOCK_Q + mid <= pid
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return lo


# Not specialized (Triton would compile a variant per value equal to 1 / divisible by 16, or per 16-byte
# alignment of a pointer, mid-serving): values that change step to step (num_seqs, the block table's row
# stride, the address of query_start_loc, a slice of the host's step buffer) and window (a compile-time 1
# would turn the mask logic into Python bools). They only feed scalar loads and masks.
@triton.jit(do_not_specialize=["window", "num_seqs", "s_bt", "qsl_ptr", "seq_lens_ptr", "bt_ptr"])
def _prefill_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, k_scale_ptr, v_scale_ptr, out_ptr,
    qk_scale, window, num_seqs,
    sq_t, sq_h, sq_d, so_t, so_h, so_d, s_bt, s_btc,
    skc_b, skc_t, skc_h, skc_d, svc_b, svc_t, svc_h, svc_d,
    HEAD_DIM,
    GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, D_PAD: tl.constexpr, HAS_SCALE: tl.constexpr, SKIP_DECODES: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = _find_seq(qsl_ptr, pid, num_seqs, BLOCK_Q)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    tile = pid - (q_start // BLOCK_Q + seq)
    if tile * BLOCK_Q >= q_len:
        return
    if SKIP_DECODES:
        if q_len == 1:  # the decode kernel has it
            return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len  # cached tokens before this step's queries
    r = tl.arange(0, BLOCK_M)  # tile row → (token i, head)
    i = tile * BLOCK_Q + r // GROUP
    i_mask = (r < BLOCK_Q * GROUP) & (i < q_len)
    q_pos = prefix + i  # [BLOCK_M]
    head = (kvh * GROUP + r % GROUP).to(tl.int64)
    d = tl.arange(0, D_PAD)
    d_mask = d < HEAD_DIM
    row_mask = i_mask[:, None] & d_mask[None, :]
    rows = (q_start + i).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * sq_t + head[:, None] * sq_h + d[None, :] * sq_d, mask=row_mask, other=0.0)
    qk = qk_scale
    if HAS_SCALE:
        qk = qk * tl.load(k_scale_ptr).to(tl.float32)
    # Keys: from the first token's window start up to the last token of the tile (causal).
    hi = prefix + tl.minimum((tile + 1) * BLOCK_Q, q_len)
    lo = tl.where(window > 0, tl.maximum(prefix + tile * BLOCK_Q - window + 1, 0), 0)
    # Finite start so rows whose keys are all masked in a tile (sliding window) give p = 0, not NaN.
    m = tl.full([BLOCK_M], -1.0e30, tl.float32)
    den = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    k_off = kvh.to(tl.int64) * skc_h
    v_off = kvh.to(tl.int64) * svc_h
    n = lo + tl.arange(0, BLOCK_N)
    blk = load_block_ids(bt_row, s_btc, n, n < hi, BLOCK_SIZE)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < hi
        blk_next = load_block_ids(bt_row, s_btc, n + BLOCK_N, n + BLOCK_N < hi, BLOCK_SIZE)
        k = load_kv_tile(kc_ptr, blk, n, n_mask, k_off, skc_b, skc_t, skc_d, d, d_mask, BLOCK_SIZE)
        v = load_kv_tile(vc_ptr, blk, n, n_mask, v_off, svc_b, svc_t, svc_d, d, d_mask, BLOCK_SIZE)
        blk = blk_next
        valid = n_mask[None, :] & (n[None, :] <= q_pos[:, None])
        valid = valid & ((window <= 0) | (n[None, :] > q_pos[:, None] - window))
        m, den, acc = attend_tile(q, k, v, valid, m, den, acc, qk)
    if HAS_SCALE:
        acc = acc * tl.load(v_scale_ptr).to(tl.float32)
    o = acc / tl.where(den > 0, den, 1.0)[:, None]
    out = out_ptr + rows[:, None] * so_t + head[:, None] * so_h + d[None, :] * so_d
    tl.store(out, o.to(out_ptr.dtype.element_ty), mask=row_mask)


def prefill_config(max_query_len: int | None, head_dim: int, fp32: bool, group: int) -> dict:
    """Tile sizes; block_m counts tile rows, block_m // group query tokens x the group's heads.

    16-bit, head_dim <= 128: 128 rows x 32 keys, 4 warps, 3 stages: 128 tokens for MHA, 64 tokens x 2 heads
    for Qwen3-0.6B (16/8), 32 x 4 for Llama-3-8B (32/8), 16 x 8. The fastest of benchmarks/attention_prefill.py's
    sweep on 7 of its 8 shapes (docs/kernels/attention.md). float32 (IEEE dots, twice the registers) and
    head_dim > 128: 32 rows x 32 keys, 4 warps, 2 stages. Short query chunks shrink block_m to the rows they
    fill (>= 16, the smallest dot); it never drops below the group, so a tile holds >= 1 token.
    """
    small = fp32 or head_dim > 128
    block_m = 32 if small else 128
    if max_query_len is not None:
        block_m = min(block_m, pow2(max_query_len * group, 16))
    block_m = max(block_m, pow2(group))
    return dict(block_m=block_m, block_n=32, num_warps=4, num_stages=2 if small else 3)


def launch_prefill(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, qk_scale, window,
                   k_scale, v_scale, out, skip_decodes, block_m, block_n, num_warps, num_stages) -> None:
    """Run the prefill kernel over every sequence with more than one new token (all if not skip_decodes)."""
    num_tokens, heads, head_dim = query.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    block_q = block_m // group
    check(block_q >= 1, f"prefill block_m {block_m} holds no token of a {group}-head group: use >= {pow2(group)}")
    num_seqs = seq_lens.shape[0]
    scaled = k_scale is not None
    grid = (num_tokens // block_q + num_seqs, kv_heads)
    _prefill_kernel[grid](
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
        k_scale if scaled else query, v_scale if scaled else query, out,
        qk_scale, window, num_seqs, *query.stride(), *out.stride(), *block_tables.stride(),
        *k_cache.stride(), *v_cache.stride(), head_dim,
        GROUP=group, BLOCK_Q=block_q, BLOCK_SIZE=k_cache.shape[1], BLOCK_M=block_m, BLOCK_N=block_n,
        D_PAD=pow2(head_dim, 16), HAS_SCALE=scaled, SKIP_DECODES=skip_decodes,
        num_warps=num_warps, num_stages=num_stages, **pdl(query.device),
    )
