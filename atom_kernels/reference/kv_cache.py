"""Paged KV-cache write (torch reference)."""

from __future__ import annotations

import torch


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Scatter K/V of each token into its cache slot.

    key, value: [num_tokens, num_kv_heads, head_dim]
    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim] (any strides)
    slot_mapping: [num_tokens] int, slot = block * block_size + offset; -1 marks padding.
    k_scale / v_scale: per-tensor scales for fp8 caches (stored value = x / scale).
    """
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blocks, offsets = slots // block_size, slots % block_size
    k, v = key[valid], value[valid]
    if k_scale is not None:
        k = k.float() / k_scale.float()
        v = v.float() / v_scale.float()
    k_cache[blocks, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, offsets] = v.to(v_cache.dtype)
