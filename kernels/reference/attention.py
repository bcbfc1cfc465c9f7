"""Paged attention over a varlen batch mixing prefills (with a cached prefix) and decodes."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    if out is None:
        out = torch.empty_like(query)
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    q_lens = [qsl[i + 1] - qsl[i] for i in range(len(lens))]
    decodes = [i for i, n in enumerate(q_lens) if n == 1]
    if len(decodes) > 1:  # all single-token queries in one batched pass (the hot path of decoding)
        rows = torch.tensor([qsl[i] for i in decodes])
        out[rows] = _decode_batch(query[rows], k_cache, v_cache, block_tables[decodes], seq_lens[decodes],
                                  scale, sliding_window, k_scale, v_scale).to(out.dtype)
    for i, seq_len in enumerate(lens):
        if q_lens[i] == 0 or (len(decodes) > 1 and q_lens[i] == 1):
            continue
        start, end = qsl[i], qsl[i + 1]
        k = _dequant(gather_kv(k_cache, block_tables[i], seq_len), k_scale)
        v = _dequant(gather_kv(v_cache, block_tables[i], seq_len), v_scale)
        q_pos = torch.arange(seq_len - (end - start), seq_len).unsqueeze(1)
        mask = _mask(q_pos, torch.arange(seq_len).unsqueeze(0), sliding_window)  # [q_len, seq]
        out[start:end] = _attend(query[start:end], k, v, mask, scale).to(out.dtype)
    return out


def _dequant(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    return x.float() if scale is None else x.float() * scale.float()


def _mask(q_pos: torch.Tensor, k_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """True where a key must NOT be seen: the future, and keys that slid out of the window."""
    mask = k_pos > q_pos
    if sliding_window is not None and sliding_window > 0:
        mask |= k_pos <= q_pos - sliding_window
    return mask


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [..., q_len, heads, d]; k, v [..., seq, kv_heads, d]; mask broadcastable to [..., heads, q_len, seq].

    torch SDPA in float32 with GQA grouping (no repeated K/V copies); its mask is True where a key IS seen.
    """
    out = F.scaled_dot_product_attention(
        q.float().transpose(-3, -2),  # [..., heads, q_len, d]
        k.transpose(-3, -2),  # [..., kv_heads, seq, d]
        v.transpose(-3, -2),
        attn_mask=~mask,
        scale=scale,
        enable_gqa=q.shape[-2] != k.shape[-2],
    )
    return out.transpose(-3, -2)  # [..., q_len, heads, d]


def _decode_batch(q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, k_scale, v_scale):
    """q [B, heads, d], one query per sequence at position seq_len - 1 → [B, heads, d]."""
    block_size = k_cache.shape[1]
    max_len = int(seq_lens.max())
    k_pos = torch.arange(max_len).view(1, -1)  # [1, max_len]
    q_pos = (seq_lens.long() - 1).view(-1, 1)  # [B, 1]
    # Positions past a sequence's end read its position 0 instead of whatever the cache holds there
    # (maybe NaN, which the mask would not cancel); the mask hides them either way.
    pos = k_pos.masked_fill(k_pos > q_pos, 0)  # [B, max_len]
    blocks = block_tables.long().gather(1, pos // block_size)
    offsets = pos % block_size
    # Two index tensors gather [B, max_len, kv_heads, d] without copying a strided (vLLM/SGLang) cache.
    k = _dequant(k_cache[blocks, offsets], k_scale)
    v = _dequant(v_cache[blocks, offsets], v_scale)
    mask = _mask(q_pos.view(-1, 1, 1, 1), k_pos.view(1, 1, 1, -1), sliding_window)  # [B, 1, 1, max_len]
    return _attend(q.unsqueeze(1), k, v, mask, scale).squeeze(1)
