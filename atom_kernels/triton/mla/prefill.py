"""MLA prefill (and chunked prefill over a cached prefix) in the absorbed form, varlen causal over the latent.

Grid (T // BLOCK_T + num_seqs, head_groups). One program takes BLOCK_T new tokens of one sequence times
BLOCK_H heads, flattened into M = BLOCK_T * BLOCK_H query rows (row = token * BLOCK_H + head), so each latent
tile it loads serves all of them. Query tiles are numbered without a host sync as in attention_prefill
(sequence i's tiles start at query_start_loc[i] // BLOCK_T + i; binary search by _find_seq). Sequence i's new
tokens sit at positions seq_len - q_len .. seq_len - 1 and attend causally over its whole cached context, the
new rows included (written to the cache before the call). Pages come straight from the block table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import pdl, pdl_prologue, pow2
from atom_kernels.triton.attention.common import load_block_ids
from atom_kernels.triton.attention.prefill import _find_seq
from atom_kernels.triton.mla.common import attend_latent, load_latent_tile, load_query


@triton.jit(do_not_specialize=["num_seqs", "s_bt", "qsl_ptr", "seq_lens_ptr", "bt_ptr"])  # as _prefill_kernel
def _mla_prefill_kernel(
    q_ptr, cache_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, scale_ptr, out_ptr,
    qk_scale, num_seqs, num_heads, R, ROPE,
    sq_t, sq_h, sq_d, so_t, so_h, so_d, s_bt, s_btc, s_b, s_t, s_d,
    BLOCK_SIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    R_PAD: tl.constexpr, PE_PAD: tl.constexpr, HAS_SCALE: tl.constexpr, SKIP_DECODES: tl.constexpr, PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    pid = tl.program_id(0)
    hg = tl.program_id(1)
    seq = _find_seq(qsl_ptr, pid, num_seqs, BLOCK_T)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    tile = pid - (q_start // BLOCK_T + seq)
    if tile * BLOCK_T >= q_len:
        return
    if SKIP_DECODES:
        if q_len == 1:  # the decode kernel has it
            return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len  # cached tokens before this step's queries
    r = tl.arange(0, BLOCK_T * BLOCK_H)
    i = tile * BLOCK_T + r // BLOCK_H  # token index inside the sequence's new tokens
    heads = hg * BLOCK_H + r % BLOCK_H
    row_mask = (i < q_len) & (heads < num_heads)
    q_pos = prefix + i
    rows = (q_start + i).to(tl.int64)
    q, q_pe = load_query(q_ptr, rows, heads, row_mask, sq_t, sq_h, sq_d, R, ROPE, R_PAD, PE_PAD)
    qk = qk_scale
    if HAS_SCALE:
        qk = qk * tl.load(scale_ptr).to(tl.float32)
    m = tl.full([BLOCK_T * BLOCK_H], -1.0e30, tl.float32)
    den = tl.zeros([BLOCK_T * BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_T * BLOCK_H, R_PAD], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    hi = prefix + tl.minimum((tile + 1) * BLOCK_T, q_len)  # keys up to the tile's last query (causal)
    n = tl.arange(0, BLOCK_N)
    blk = load_block_ids(bt_row, s_btc, n, n < hi, BLOCK_SIZE)
    for n0 in range(0, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < hi
        blk_next = load_block_ids(bt_row, s_btc, n + BLOCK_N, n + BLOCK_N < hi, BLOCK_SIZE)
        kv, pe = load_latent_tile(cache_ptr, blk, n, n_mask, s_b, s_t, s_d, R, ROPE, BLOCK_SIZE, R_PAD, PE_PAD)
        valid = n_mask[None, :] & (n[None, :] <= q_pos[:, None])
        m, den, acc = attend_latent(q, q_pe, kv, pe, valid, m, den, acc, qk)
        blk = blk_next
    if HAS_SCALE:
        acc = acc * tl.load(scale_ptr).to(tl.float32)
    o = acc / tl.where(den > 0, den, 1.0)[:, None]
    c = tl.arange(0, R_PAD)
    out = out_ptr + rows[:, None] * so_t + heads[:, None] * so_h + c[None, :] * so_d
    tl.store(out, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & (c < R)[None, :])


def mla_prefill_config(max_query_len: int | None, num_heads: int, kv_lora_rank: int, query_dtype) -> dict:
    """M = BLOCK_T * BLOCK_H query rows a program, up to 16 heads, fewer tokens for short chunks. The float32
    accumulator [M, R_PAD] bounds M: 64 rows for a small latent, 32 (at 8 warps: 64 registers a thread) for
    512, 16 for float32 queries (IEEE dots, twice the registers)."""
    fp32 = query_dtype == torch.float32
    wide = pow2(kv_lora_rank, 16) > 128
    rows = 16 if fp32 else (32 if wide else 64)
    block_h = min(pow2(num_heads), 16, rows)
    block_t = rows // block_h
    if max_query_len is not None:
        block_t = min(block_t, pow2(max_query_len))
    block_t = max(block_t, 16 // block_h)  # tl.dot needs M >= 16
    return dict(block_t=block_t, block_h=block_h, block_n=16 if fp32 else 32,
                num_warps=8 if wide and not fp32 else 4, num_stages=1 if fp32 else 2)


def launch_mla_prefill(query, cache, block_tables, seq_lens, query_start_loc, qk_scale, kv_lora_rank, cache_scale,
                       out, skip_decodes, block_t, block_h, block_n, num_warps, num_stages) -> None:
    """Run the prefill kernel over every sequence with more than one new token (all if not skip_decodes)."""
    num_tokens, heads, width = query.shape
    num_seqs = seq_lens.shape[0]
    scaled = cache_scale is not None
    grid = (num_tokens // block_t + num_seqs, triton.cdiv(heads, block_h))
    _mla_prefill_kernel[grid](
        query, cache, block_tables, seq_lens, query_start_loc, cache_scale if scaled else query, out,
        qk_scale, num_seqs, heads, kv_lora_rank, width - kv_lora_rank,
        *query.stride(), *out.stride(), *block_tables.stride(), *cache.stride(),
        BLOCK_SIZE=cache.shape[1], BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_N=block_n,
        R_PAD=pow2(kv_lora_rank, 16), PE_PAD=pow2(width - kv_lora_rank, 16), HAS_SCALE=scaled,
        SKIP_DECODES=skip_decodes, num_warps=num_warps, num_stages=num_stages, **pdl(query.device),
    )
