"""write_kv_cache and the fused Qwen3 prologue (fused_qk_norm_rope_write_kv) on CPU, in fewer torch calls than the
reference: the KV cache written with index_copy_ into its slot rows instead of a masked advanced-index assignment;
q and k heads normed and rotated as one tensor, the rotation as one product with the half-swapped heads
(x2 * -sin instead of -x2 * sin: the same float)."""

from __future__ import annotations

import torch

from atom_kernels import reference
from atom_kernels.cpu import all_float32
from atom_kernels.reference.attention import slot_rows


def write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """As reference.write_kv_cache: key/value [T, kv_heads, d] into the caches' slots, each a row of the caches'
    slot_rows views (the reference serves fp8 scales, padding slots -1 and caches whose blocks are not back to
    back)."""
    (k_rows, pitch), (v_rows, v_pitch) = slot_rows(k_cache), slot_rows(v_cache)
    if (k_scale is not None or not all_float32(key, value, k_cache, v_cache)
            or not pitch == v_pitch == k_cache.shape[1] or not len(slot_mapping) or slot_mapping.min().item() < 0):
        return reference.write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    slots = slot_mapping.long()
    k_rows.index_copy_(0, slots, key)
    v_rows.index_copy_(0, slots, value)


def fused_qk_norm_rope_write_kv(positions, query, key, value, q_weight, k_weight, eps: float, cos_sin_cache,
                                k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> torch.Tensor:
    """As reference.fused_qk_norm_rope_write_kv: query [T, heads, d], key/value [T, kv_heads, d] → the normed,
    rotated query; the normed, rotated key and the value written into the caches."""
    (t, heads, d), kv_heads = query.shape, key.shape[1]
    if (not all_float32(query, key, q_weight, k_weight, cos_sin_cache) or k_scale is not None
            or cos_sin_cache.shape[-1] != d):
        return reference.fused_qk_norm_rope_write_kv(positions, query, key, value, q_weight, k_weight, eps,
                                                     cos_sin_cache, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    # Per-head RMSNorm of q and k heads together ([T, heads + kv_heads, d]), then each head's weight.
    x = torch.rms_norm(torch.cat((query, key), dim=1), (d,), None, eps)
    x = x * torch.cat((q_weight.expand(heads, d), k_weight.expand(kv_heads, d)))
    # Neox rotary: (x1, x2) → (x1 * cos - x2 * sin, x2 * cos + x1 * sin), both halves at once over [..., 2, d/2]
    # views: x * cos + (x2, x1) * (-sin, sin).
    cos, sin = cos_sin_cache[positions].view(t, 1, 2, d // 2).unbind(2)  # [T, 1, d/2] each
    halves = x.view(t, heads + kv_heads, 2, d // 2)
    swapped = halves.roll(1, 2)  # (x2, x1): a roll by one of two is a flip, and much faster than flip
    y = (halves * cos.unsqueeze(2) + swapped * torch.stack((-sin, sin), dim=2)).view(t, heads + kv_heads, d)
    write_kv_cache(y[:, heads:], value, k_cache, v_cache, slot_mapping)
    return y[:, :heads]
