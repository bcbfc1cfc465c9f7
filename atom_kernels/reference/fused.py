"""Qwen3's attention prologue as one op: per-head q/k RMSNorm, rotary, paged K/V write (torch reference)."""

from __future__ import annotations

import torch

from atom_kernels.reference.kv_cache import write_kv_cache
from atom_kernels.reference.norm import rms_norm
from atom_kernels.reference.rotary import rotary


def fused_qk_norm_rope_write_kv(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """rms_norm(q), rms_norm(k) per head → rotary → write (k, value) into the caches; returns the query.

    positions [T]; query [T, heads, d]; key/value [T, kv_heads, d]; q_weight/k_weight [d];
    caches, slot_mapping and scales as in write_kv_cache; cos_sin_cache as in rotary.
    Returns the normed, rotated query [T, heads, d] (dtype of q_weight * query, as rms_norm gives).
    """
    q = rms_norm(query, q_weight, eps)
    k = rms_norm(key, k_weight, eps)
    q, k = rotary(positions, q, k, cos_sin_cache)
    write_kv_cache(k, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q
