"""The Attention factory and the one shared attention computation.

Model code writes `Attention(num_heads, head_dim, scale, num_kv_heads, prefix=...)` and never
branches on the host: `Attention.__new__` builds an AttentionSpec, asks the current host's frontend
for its layer class (`atom_attention_impl`) and its metadata builder (`atom_metadata_builder`), and
returns an instance of the class with the builder attached as `layer.metadata_builder`: the host's
runner or backend reads the builder from the layers it runs (metadata_builder_of).
"""

from __future__ import annotations

import torch

import atom_kernels
from atom_core.forward_context import AttentionMetadata
from atom_core.layers.attention_spec import FULL_ATTENTION_OPS, MLA_OPS, AttentionSpec
from atom_core.plugins import host_hooks

__all__ = ["FULL_ATTENTION_OPS", "MLA_OPS", "Attention", "AttentionSpec", "attention_forward", "metadata_builder_of",
           "mla_forward", "qk_norm_rope_attention_forward"]


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
        hooks = host_hooks()  # the current host's frontend
        layer_cls = hooks.atom_attention_impl(spec=spec)
        builder = hooks.atom_metadata_builder(spec=spec)
        layer = layer_cls(spec)
        layer.metadata_builder = builder
        return layer


def metadata_builder_of(layers) -> object:
    """The metadata builder the Attention factory attached to `layers` (a model's attention layers, or any
    modules: those without one are skipped). Exactly one must be found: a step's batch has one metadata."""
    builders = {id(b): b for layer in layers if (b := getattr(layer, "metadata_builder", None)) is not None}
    if len(builders) != 1:
        raise RuntimeError(f"expected the one metadata builder the Attention factory attaches to a model's attention "
                           f"layers, found {len(builders)}: build the model's attention with atom_core's Attention "
                           "inside its host's scope")
    return next(iter(builders.values()))


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
