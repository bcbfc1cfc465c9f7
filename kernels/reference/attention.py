"""Paged attention over a varlen batch mixing prefills (with a cached prefix) and decodes."""

from __future__ import annotations

import torch


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """cache [num_blocks, block_size, kv_heads, d] + one row of the block table → [seq_len, kv_heads, d]."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table[:num_blocks].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:seq_len]


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its whole cached context.

    query: [num_tokens, num_heads, head_dim]; sequence i owns rows
    query_start_loc[i]:query_start_loc[i+1], which sit at the LAST positions of its seq_lens[i] tokens.
    block_tables: [num_seqs, max_blocks]; seq_lens: [num_seqs] (context incl. the new tokens).
    sliding_window: a query at position p sees keys at positions > p - sliding_window.
    Returns [num_tokens, num_heads, head_dim] in query's dtype. Math runs in float32.
    """
    num_heads = query.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(query)
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        start, end = qsl[i], qsl[i + 1]
        if end == start:
            continue
        k = gather_kv(k_cache, block_tables[i], seq_len).float()
        v = gather_kv(v_cache, block_tables[i], seq_len).float()
        if k_scale is not None:
            k, v = k * k_scale.float(), v * v_scale.float()
        # [kv_heads, seq, d] → repeated per query head: [heads, seq, d]
        k = k.transpose(0, 1).repeat_interleave(group, dim=0)
        v = v.transpose(0, 1).repeat_interleave(group, dim=0)
        q = query[start:end].float().transpose(0, 1)  # [heads, q_len, d]
        scores = torch.matmul(q, k.transpose(1, 2)) * scale  # [heads, q_len, seq]
        q_pos = torch.arange(seq_len - (end - start), seq_len).unsqueeze(1)
        k_pos = torch.arange(seq_len).unsqueeze(0)
        mask = k_pos > q_pos
        if sliding_window is not None and sliding_window > 0:
            mask |= k_pos <= q_pos - sliding_window
        scores.masked_fill_(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.matmul(probs, v).transpose(0, 1).to(out.dtype)
    return out
