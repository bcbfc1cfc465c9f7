"""Paged attention over a varlen batch mixing prefills (with a cached prefix) and decodes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F

T = TypeVar("T")


@dataclass
class _Gather:
    """Which cache rows one group of queries reads, and what it may not see."""

    rows: slice | torch.Tensor  # the query rows (a slice for a prefill, [B] indices for the decodes)
    blocks: torch.Tensor  # [..., seq] int64 block ids of the keys to read
    offsets: torch.Tensor  # [..., seq] int64 offsets inside those blocks
    seen: torch.Tensor  # broadcastable to [..., heads, q_len, seq]: True where a key may be seen


def plan(block_tables, seq_lens, query_start_loc, block_size: int, sliding_window: int | None) -> list[_Gather]:
    """The batch's gathers: all single-token queries in one batched group (the hot path of decoding),
    each longer query (prefill or chunk) in its own. Depends only on the step's metadata, so every
    layer of one step can share it (see `plan_cache`)."""
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    q_lens = [qsl[i + 1] - qsl[i] for i in range(len(lens))]
    tables = block_tables.long()
    dev = block_tables.device
    decodes = [i for i, n in enumerate(q_lens) if n == 1]
    batched = len(decodes) > 1
    gathers = []
    if batched:
        max_len = max(lens[i] for i in decodes)
        k_pos = torch.arange(max_len, device=dev).view(1, -1)  # [1, max_len]
        q_pos = torch.tensor([lens[i] - 1 for i in decodes], device=dev).view(-1, 1)  # [B, 1]
        # Positions past a sequence's end read its position 0 instead of whatever the cache holds there
        # (maybe NaN, which a mask would not cancel); the mask hides them either way.
        pos = k_pos.masked_fill(k_pos > q_pos, 0)  # [B, max_len]
        seen = _seen(q_pos.view(-1, 1, 1, 1), k_pos.view(1, 1, 1, -1), sliding_window)  # [B, 1, 1, max_len]
        rows = torch.tensor([qsl[i] for i in decodes], device=dev)
        gathers.append(_Gather(rows, tables[decodes].gather(1, pos // block_size), pos % block_size, seen))
    for i, seq_len in enumerate(lens):
        if q_lens[i] == 0 or (batched and q_lens[i] == 1):
            continue
        pos = torch.arange(seq_len, device=dev)
        q_pos = torch.arange(seq_len - q_lens[i], seq_len, device=dev).unsqueeze(1)
        seen = _seen(q_pos, pos.unsqueeze(0), sliding_window)  # [q_len, seq]
        gathers.append(_Gather(slice(qsl[i], qsl[i + 1]), tables[i, pos // block_size], pos % block_size, seen))
    return gathers


def step_memo(plan_cache: dict | None, key, make: Callable[[], T]) -> T:
    """make(), once per step: kept in `plan_cache` (the metadata's scratch, shared by every layer) under `key`
    when given, made afresh otherwise."""
    if plan_cache is None:
        return make()
    value = plan_cache.get(key)
    if value is None:
        value = plan_cache[key] = make()
    return value


def cached_plan(plan_cache: dict | None, op: str, block_tables, seq_lens, query_start_loc, block_size: int,
                sliding_window: int | None) -> list[_Gather]:
    """plan(...), made once per step and op."""
    return step_memo(plan_cache, (op, block_size, sliding_window),
                     lambda: plan(block_tables, seq_lens, query_start_loc, block_size, sliding_window))


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
    plan_cache: dict | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its whole cached context.

    query: [num_tokens, num_heads, head_dim]; sequence i owns rows
    query_start_loc[i]:query_start_loc[i+1], which sit at the LAST positions of its seq_lens[i] tokens.
    block_tables: [num_seqs, max_blocks]; seq_lens: [num_seqs] (context incl. the new tokens).
    sliding_window: a query at position p sees keys at positions > p - sliding_window.
    plan_cache: a dict that lives for one step (the metadata's scratch): the batch's gather plan is
    made once and reused by every layer.
    Returns [num_tokens, num_heads, head_dim] in query's dtype. Math runs in float32.
    """
    if out is None:
        out = torch.empty_like(query)
    gathers = cached_plan(plan_cache, "reference.paged_attention", block_tables, seq_lens, query_start_loc,
                          k_cache.shape[1], sliding_window)
    for g in gathers:
        # Two index tensors gather [..., seq, kv_heads, d] without copying a strided (vLLM/SGLang) cache.
        k = _dequant(k_cache[g.blocks, g.offsets], k_scale)
        v = _dequant(v_cache[g.blocks, g.offsets], v_scale)
        q = query[g.rows]
        batched = isinstance(g.rows, torch.Tensor)  # decodes: [B, heads, d] → one query row each
        o = _attend(q.unsqueeze(1) if batched else q, k, v, g.seen, scale)
        out[g.rows] = (o.squeeze(1) if batched else o).to(out.dtype)
    return out


def _dequant(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    return x.float() if scale is None else x.float() * scale.float()


def _seen(q_pos: torch.Tensor, k_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """True where a key may be seen: not in the future, and not slid out of the window."""
    seen = k_pos <= q_pos
    if sliding_window is not None and sliding_window > 0:
        seen &= k_pos > q_pos - sliding_window
    return seen


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor, scale: float) -> torch.Tensor:
    """q [..., q_len, heads, d]; k, v [..., seq, kv_heads, d]; seen broadcastable to [..., heads, q_len, seq].

    torch SDPA in float32 with GQA grouping (no repeated K/V copies).
    """
    out = F.scaled_dot_product_attention(
        q.float().transpose(-3, -2),  # [..., heads, q_len, d]
        k.transpose(-3, -2),  # [..., kv_heads, seq, d]
        v.transpose(-3, -2),
        attn_mask=seen,
        scale=scale,
        enable_gqa=q.shape[-2] != k.shape[-2],
    )
    return out.transpose(-3, -2)  # [..., q_len, heads, d]
