"""The Attention factory, the layer spec hosts receive, and the one shared attention computation.

Model code writes `Attention(num_heads, head_dim, scale, num_kv_heads, prefix=...)` and never
branches on the host: `Attention.__new__` asks the `atom_attention_impl` hook for the current
host's layer class and returns an instance of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import atom_kernels
from atom_core.forward_context import AttentionMetadata
from atom_core.plugins import attention_impl

# The atom_kernels ops each kind of attention runs: hosts check that a device has kernels for them.
FULL_ATTENTION_OPS = ("write_kv_cache", "paged_attention")
MLA_OPS = ("write_latent_cache", "mla_attention")


@dataclass(frozen=True)
class AttentionSpec:
    num_heads: int  # query heads on this rank
    head_dim: int
    scale: float
    num_kv_heads: int  # KV heads on this rank
    prefix: str  # layer name, e.g. "model.layers.3.self_attn.attn"
    sliding_window: int | None = None  # None or <= 0: full attention
    kv_cache_dtype: str = "auto"
    # MLA (latent cache) fields; unused by full-attention layers.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None

    @property
    def uses_sliding_window(self) -> bool:
        return self.sliding_window is not None and self.sliding_window > 0

    @property
    def kernel_ops(self) -> tuple[str, ...]:
        """The atom_kernels ops a layer of this spec runs (its KV write and its attention)."""
        return MLA_OPS if self.is_mla else FULL_ATTENTION_OPS

    @property
    def is_mla(self) -> bool:
        """A latent-cache (MLA) layer: one KV "head" of head_dim = kv_lora_rank + qk_rope_head_dim per token."""
        return self.kv_lora_rank is not None


class Attention:
    """Factory: returns an instance of the host's attention layer class for this spec."""

    def __new__(cls, num_heads: int, head_dim: int, scale: float, num_kv_heads: int | None = None, *,
                sliding_window: int | None = None, kv_cache_dtype: str = "auto", prefix: str = "",
                kv_lora_rank: int | None = None, qk_rope_head_dim: int | None = None):
        num_kv_heads = num_kv_heads or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        if not prefix:
            raise ValueError("Attention needs its layer prefix (e.g. 'model.layers.0.self_attn.attn')")
        if kv_lora_rank is not None:
            _check_mla(head_dim, num_kv_heads, kv_lora_rank, qk_rope_head_dim)
        spec = AttentionSpec(num_heads, head_dim, scale, num_kv_heads, prefix,
                             sliding_window if sliding_window and sliding_window > 0 else None,
                             kv_cache_dtype, kv_lora_rank, qk_rope_head_dim)
        return attention_impl(spec)(spec)


def _check_mla(head_dim: int, num_kv_heads: int, kv_lora_rank: int, qk_rope_head_dim: int | None) -> None:
    if qk_rope_head_dim is None or head_dim != kv_lora_rank + qk_rope_head_dim or num_kv_heads != 1:
        raise ValueError(f"an MLA Attention (kv_lora_rank={kv_lora_rank}) needs qk_rope_head_dim, num_kv_heads=1 and "
                         f"head_dim = kv_lora_rank + qk_rope_head_dim (got head_dim={head_dim}, "
                         f"qk_rope_head_dim={qk_rope_head_dim}, num_kv_heads={num_kv_heads})")


def attention_forward(
    spec: AttentionSpec,
    query: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write this step's K/V into the paged cache (unless key is None), then attend.

    query [T, heads*head_dim]; key/value [T, kv_heads*head_dim]; caches are views of logical
    shape [num_blocks, block_size, kv_heads, head_dim] (any strides). Returns [T, heads*head_dim].
    """
    t = query.shape[0]
    q = query.view(t, spec.num_heads, spec.head_dim)
    if key is not None:
        k = key.view(t, spec.num_kv_heads, spec.head_dim)
        v = value.view(t, spec.num_kv_heads, spec.head_dim)
        atom_kernels.write_kv_cache(k, v, k_cache, v_cache, md.slot_mapping, k_scale, v_scale)
    o = atom_kernels.paged_attention(
        q, k_cache, v_cache, md.block_tables, md.seq_lens, md.query_start_loc, spec.scale,
        sliding_window=spec.sliding_window, k_scale=k_scale, v_scale=v_scale,
        out=None if out is None else out.view(t, spec.num_heads, spec.head_dim),
        max_query_len=md.max_query_len, max_seq_len=md.max_seq_len,
        num_decodes=md.num_decodes, num_prefills=md.num_prefills, plan_cache=md.plan_cache,
    )
    return o.reshape(t, spec.num_heads * spec.head_dim)


def qk_norm_rope_attention_forward(
    spec: AttentionSpec,
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    norm_rope: tuple[torch.Tensor, torch.Tensor, float, torch.Tensor],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """attention_forward with Qwen3's prologue fused into the K/V write: per-head RMSNorm of q and k, the neox
    rotary, then K/V written at md.slot_mapping, in one op (fused_qk_norm_rope_write_kv); equal to the unfused
    norm → rotary → attention_forward. positions [T]; query [T, heads, head_dim], key/value [T, kv_heads,
    head_dim] (strided rows); norm_rope: (q_norm weight [head_dim], k_norm weight [head_dim], eps, the rotary's
    cos|sin table [max_positions, rotary_dim]). Returns [T, heads*head_dim]."""
    q_weight, k_weight, eps, cos_sin_cache = norm_rope
    q = atom_kernels.fused_qk_norm_rope_write_kv(positions, query, key, value, q_weight, k_weight, eps,
                                                 cos_sin_cache, k_cache, v_cache, md.slot_mapping, k_scale, v_scale)
    return attention_forward(spec, q.view(q.shape[0], -1), None, None, k_cache, v_cache, md, k_scale, v_scale, out)


def mla_forward(
    spec: AttentionSpec,
    query: torch.Tensor,
    latent: torch.Tensor | None,
    cache: torch.Tensor,
    md: AttentionMetadata,
    cache_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """MLA in the absorbed form: write this step's latent rows (unless latent is None), then attend.

    query [T, heads, r + rope] (W_UK folded in, rope dims rotated); latent [T, r + rope] (normalised KV latent,
    then the rotated shared rope key); cache: a view of logical shape [num_blocks, block_size, r + rope].
    Returns [T, heads, r]: attention over the latents (the caller applies W_UV).
    """
    if latent is not None:
        atom_kernels.write_latent_cache(latent, cache, md.slot_mapping, cache_scale)
    return atom_kernels.mla_attention(query, cache, md.block_tables, md.seq_lens, md.query_start_loc, spec.scale,
                                      spec.kv_lora_rank, cache_scale, out, md.plan_cache,
                                      decode_metadata=md.mla_decode, max_query_len=md.max_query_len,
                                      max_seq_len=md.max_seq_len,
                                      num_decodes=md.num_decodes, num_prefills=md.num_prefills)
