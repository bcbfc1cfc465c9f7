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
    """One group of sequences with the same number of new tokens n: which rows they read, what they may not see."""

    rows: slice | torch.Tensor  # their B * n query rows, sequence after sequence (a slice when adjacent)
    num_seqs: int  # B
    slots: torch.Tensor  # [B, seq] int64 rows of the keys to read in the cache's slot_rows view
    # [B, 1, n, seq] float32: 0 where a key may be seen, -inf elsewhere. What SDPA makes of a boolean mask on
    # every call, made here once per step.
    mask: torch.Tensor


def plan(block_tables, seq_lens, query_start_loc, block_size: int, pitch: int,
         sliding_window: int | None) -> list[_Gather]:
    """The batch's gathers: one per query length, so every sequence with that many new tokens attends in one
    batched SDPA (a step's decodes, equal prompts); `pitch` as slot_rows gives it. Depends only on the step's
    metadata, so every layer of one step can share it (see `plan_cache`)."""
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    groups: dict[int, list[int]] = {}  # new tokens → the sequences with that many
    for i in range(len(lens)):
        if qsl[i + 1] > qsl[i]:
            groups.setdefault(qsl[i + 1] - qsl[i], []).append(i)
    tables = block_tables.long()
    return [_group(tables, seqs, n, qsl, lens, block_size, pitch, sliding_window) for n, seqs in groups.items()]


def _group(tables: torch.Tensor, seqs: list[int], n: int, qsl: list[int], lens: list[int], block_size: int,
           pitch: int, sliding_window: int | None) -> _Gather:
    """The gather of sequences `seqs`, n new tokens each: keys up to the longest context among them."""
    dev = tables.device
    k_pos = torch.arange(max(lens[i] for i in seqs), device=dev)  # [L]
    ends = torch.tensor([lens[i] for i in seqs], device=dev).view(-1, 1)  # [B, 1]
    q_pos = ends - n + torch.arange(n, device=dev)  # [B, n]
    # Positions past a sequence's end read its position 0 instead of whatever the cache holds there
    # (maybe NaN, which a mask would not cancel); the mask hides them either way.
    pos = k_pos.masked_fill(k_pos >= ends, 0)  # [B, L]
    slots = tables[seqs].gather(1, pos // block_size) * pitch + pos % block_size
    mask = _mask(q_pos.view(-1, 1, n, 1), k_pos, sliding_window)  # [B, 1, n, L]
    starts = [qsl[i] for i in seqs]
    if starts[-1] - starts[0] == (len(seqs) - 1) * n:  # adjacent (a decode-only step, a batch of prompts)
        rows = slice(starts[0], starts[0] + len(seqs) * n)
    else:
        rows = (torch.tensor(starts, device=dev).view(-1, 1) + torch.arange(n, device=dev)).flatten()
    return _Gather(rows, len(seqs), slots, mask)


def step_memo(plan_cache: dict | None, key, make: Callable[[], T]) -> T:
    """make(), once per step: kept in `plan_cache` (the metadata's per-step memo, shared by every layer) under `key`
    when given, made afresh otherwise."""
    if plan_cache is None:
        return make()
    value = plan_cache.get(key)
    if value is None:
        value = plan_cache[key] = make()
    return value


def cached_plan(plan_cache: dict | None, op: str, block_tables, seq_lens, query_start_loc, block_size: int,
                pitch: int, sliding_window: int | None) -> list[_Gather]:
    """plan(...), made once per step and op."""
    return step_memo(plan_cache, (op, block_size, pitch, sliding_window),
                     lambda: plan(block_tables, seq_lens, query_start_loc, block_size, pitch, sliding_window))


def slot_rows(cache: torch.Tensor) -> tuple[torch.Tensor, int]:
    """cache [num_blocks, block_size, ...] (any strides: ours, vLLM's, SGLang's) → (rows [N, ...], pitch): a view
    in which (block, offset) is row block * pitch + offset, so one index_select gathers a step's keys (indexing
    with a block and an offset tensor costs 3x as much). Rows between blocks' ends (other heads' data in vLLM's
    head-major pages) are never read."""
    num_blocks, block_size, *inner = cache.shape
    block_stride, row_stride, *inner_strides = cache.stride()
    if block_size == 1:  # one row per block: its stride does not matter
        row_stride = block_stride
    if block_stride % row_stride:
        raise ValueError(f"a KV cache whose block stride {block_stride} is not a multiple of its row stride "
                         f"{row_stride}: its rows are not evenly spaced")
    pitch = block_stride // row_stride
    n = (num_blocks - 1) * pitch + block_size
    return cache.as_strided((n, *inner), (row_stride, *inner_strides)), pitch


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
    plan_cache: a dict that lives for one step (AttentionMetadata.plan_cache): the batch's gather plan is
    made once and reused by every layer.
    Returns [num_tokens, num_heads, head_dim] in query's dtype. Math runs in float32.
    """
    (k_rows, pitch), (v_rows, v_pitch) = slot_rows(k_cache), slot_rows(v_cache)
    if v_pitch != pitch:
        raise ValueError(f"K and V caches of different layouts (block pitch {pitch} vs {v_pitch} rows)")
    gathers = cached_plan(plan_cache, "reference.paged_attention", block_tables, seq_lens, query_start_loc,
                          k_cache.shape[1], pitch, sliding_window)
    for g in gathers:
        k = _dequant(_gather(k_rows, g.slots), k_scale)  # [B, seq, kv_heads, d]
        v = _dequant(_gather(v_rows, g.slots), v_scale)
        q = query[g.rows].view(g.num_seqs, -1, *query.shape[1:])  # [B, n, heads, d]
        o = _attend(q, k, v, g.mask, scale).flatten(0, 1).to(query.dtype)
        if out is None and isinstance(g.rows, slice) and g.rows == slice(0, len(query)):
            return o  # one group, every row (a decode-only step): no copy
        if out is None:
            out = torch.empty_like(query)
        out[g.rows] = o
    return torch.empty_like(query) if out is None else out  # (no rows)


def _gather(rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """rows [N, ...] (slot_rows), slots [B, seq] → [B, seq, ...]"""
    return rows.index_select(0, slots.flatten()).view(*slots.shape, *rows.shape[1:])


def _dequant(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    if scale is None:
        return x if x.dtype == torch.float32 else x.float()  # (a call less per layer on a float32 cache)
    return x.float() * scale.float()


def _mask(q_pos: torch.Tensor, k_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """Additive float32 mask: -inf for keys in the future or slid out of the window, 0 for the others."""
    hidden = k_pos > q_pos
    if sliding_window is not None and sliding_window > 0:
        hidden |= k_pos <= q_pos - sliding_window
    return torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device).masked_fill_(hidden, float("-inf"))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [..., q_len, heads, d]; k, v [..., seq, kv_heads, d]; mask (additive) broadcastable to
    [..., heads, q_len, seq].

    torch SDPA in float32 with GQA grouping (no repeated K/V copies).
    """
    out = F.scaled_dot_product_attention(
        q.float().transpose(-3, -2),  # [..., heads, q_len, d]
        k.transpose(-3, -2),  # [..., kv_heads, seq, d]
        v.transpose(-3, -2),
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.shape[-2] != k.shape[-2],
    )
    return out.transpose(-3, -2)  # [..., q_len, heads, d]
