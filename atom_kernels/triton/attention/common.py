"""Pieces shared by the prefill and decode attention kernels: paged K/V tile loads, one online-softmax step.

Caches are strided views of logical shape [num_blocks, block_size, kv_heads, head_dim]; token n of a
sequence lives in block block_table[n // block_size] at offset n % block_size.
"""

from __future__ import annotations

import triton
import triton.language as tl

from atom_kernels.triton._utils import powers_of_two_up_to

LOG2E = 1.4426950408889634


@triton.jit
def load_block_ids(bt_row, s_btc, n, n_mask, BLOCK_SIZE: tl.constexpr):
    """Physical block of each token position n [BLOCK_N] of one sequence (int64, 0 where masked).

    The loops load these one tile ahead and carry them: with the table load in the same iteration as
    the K/V loads it depends on, Triton's pipeliner keeps only one K/V tile in flight (measured: one
    smem buffer at any num_stages); carried, K/V get num_stages - 1 buffers.
    """
    return tl.load(bt_row + (n // BLOCK_SIZE) * s_btc, mask=n_mask, other=0).to(tl.int64)


@triton.jit
def load_kv_tile(cache_ptr, blk, n, n_mask, head_off, s_b, s_t, s_d, d, d_mask, BLOCK_SIZE: tl.constexpr):
    """Tokens n [BLOCK_N] (in blocks blk) of one KV head → [BLOCK_N, D_PAD], cache dtype, 0 where masked."""
    row = blk * s_b + (n % BLOCK_SIZE).to(tl.int64) * s_t
    ptr = cache_ptr + head_off + row[:, None] + d[None, :] * s_d
    return tl.load(ptr, mask=n_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def attend_tile(q, k, v, valid, m, den, acc, qk_scale):
    """One flash-attention step in the log2 domain.

    q [M, D] (dot dtype), k/v [N, D] (cache dtype), valid [M, N]; m, den [M] and acc [M, D] float32.
    qk_scale = softmax scale * log2(e) (* k_scale for fp8). fp8 K/V are upcast to q's dtype (exact);
    float32 dot products run in IEEE precision (ignored for 16-bit inputs).
    """
    dot_dtype = q.dtype
    s = tl.dot(q, tl.trans(k.to(dot_dtype)), input_precision="ieee") * qk_scale
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    den = den * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(dot_dtype), v.to(dot_dtype), input_precision="ieee")
    return m_new, den, acc


def softmax_scale(scale: float) -> float:
    return float(scale) * LOG2E


def warm_up_batches(max_model_len: int, max_tokens: int) -> list[tuple[list[int], list[int], int]]:
    """(query lengths, sequence lengths, max_seq_len hint) of batches reaching every variant the varlen attention
    kernels (paged and MLA) compile for these bounds: their prefill tiles follow the power-of-two bucket of the
    longest query, and whether decodes share the batch (skip_decodes); their decode split count and merge tile the
    power-of-two bucket of the context hint. So: a query of each power-of-two length up to the step's token budget
    (and the budget itself), alone and next to a decode, and a decode under each power-of-two hint up to
    max_model_len. tests/kernels/test_kernel_warmup.py checks them against the kernels' config functions."""
    top = min(max_tokens, max_model_len)
    lens = powers_of_two_up_to(top, 2) if top > 1 else []
    batches = [([q], [q], q) for q in lens]  # a prefill alone
    batches += [([1, q], [2, q], q) for q in lens]  # next to a decode
    return batches + [([1], [1], hint) for hint in powers_of_two_up_to(max_model_len, 1)]  # decodes
