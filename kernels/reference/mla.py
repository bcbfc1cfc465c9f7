"""Multi-head latent attention (DeepSeek-V2/V3 MLA) over a paged latent cache (torch reference).

The cache holds one "head" per token: the normalised KV latent (kv_lora_rank features) followed by the
rotated shared rope key (qk_rope_head_dim features), logical shape [num_blocks, block_size, r + rope] (any
strides: vLLM's [blocks, 1, 16, r + rope] indexed at head 0, SGLang's [slots, 1, r + rope] as block size 1).
Attention runs in the absorbed form: the layer has folded W_UK into the query and applies W_UV to the
output, so keys are whole cache rows and values their first r features.
"""

from __future__ import annotations

import torch

from atom_kernels.reference.attention import _attend, _dequant, cached_plan


def write_latent_cache(latent: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor,
                       scale: torch.Tensor | None = None) -> None:
    """Scatter each token's latent row into its cache slot.

    latent: [num_tokens, r + rope]; cache: [num_blocks, block_size, r + rope] (any strides);
    slot_mapping: [num_tokens] int, slot = block * block_size + offset, -1 marks padding;
    scale: per-tensor scale of an fp8 cache (stored value = x / scale).
    """
    block_size = cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    rows = latent[valid]
    if scale is not None:
        rows = rows.float() / scale.float()
    cache[slots // block_size, slots % block_size] = rows.to(cache.dtype)


def mla_attention(
    query: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    kv_lora_rank: int,
    cache_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    plan_cache: dict | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its cached latents (the absorbed form).

    query: [num_tokens, heads, r + rope] (W_UK already folded into the first r features); sequence i owns
    rows query_start_loc[i]:query_start_loc[i+1], the LAST positions of its seq_lens[i] tokens.
    cache: [num_blocks, block_size, r + rope]; block_tables [num_seqs, max_blocks]; seq_lens [num_seqs].
    Logits = scale * q · row; out = softmax-weighted sum of row[:r].
    plan_cache: the metadata's per-step scratch dict (the gather plan is made once per step).
    Returns [num_tokens, heads, r] in query's dtype. Math runs in float32.
    """
    t, heads, width = query.shape
    if width != cache.shape[-1] or not 0 < kv_lora_rank < width:
        raise ValueError(f"mla_attention: query rows of {width} features, cache rows of {cache.shape[-1]}, "
                         f"kv_lora_rank {kv_lora_rank}: both rows must be kv_lora_rank + qk_rope_head_dim wide")
    if out is None:
        out = query.new_empty(t, heads, kv_lora_rank)
    gathers = cached_plan(plan_cache, "reference.mla_attention", block_tables, seq_lens, query_start_loc,
                          cache.shape[1], None)
    for g in gathers:
        rows = _dequant(cache[g.blocks, g.offsets], cache_scale).unsqueeze(-2)  # [..., seq, 1, r + rope]
        q = query[g.rows]
        batched = isinstance(g.rows, torch.Tensor)  # decodes: [B, heads, D] → one query row each
        o = _attend(q.unsqueeze(1) if batched else q, rows, rows[..., :kv_lora_rank], g.seen, scale)
        out[g.rows] = (o.squeeze(1) if batched else o).to(out.dtype)
    return out
