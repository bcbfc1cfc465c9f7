"""Multi-head latent attention (DeepSeek-V2/V3 MLA) over a paged latent cache (torch reference).

The cache holds one "head" per token: the normalised KV latent (kv_lora_rank features) followed by the
rotated shared rope key (qk_rope_head_dim features), logical shape [num_blocks, block_size, r + rope] (any
strides: vLLM's [blocks, 1, 16, r + rope] indexed at head 0, SGLang's [slots, 1, r + rope] as block size 1).
Attention runs in the absorbed form: the layer has folded W_UK into the query and applies W_UV to the
output, so keys are whole cache rows and values their first r features.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from atom_kernels import dispatch
from atom_kernels.reference.attention import _attend, _dequant, _gather, cached_plan, slot_rows, step_memo

# The plan_cache key of the step's MLA decode metadata (made once a step, shared by every MLA layer).
_MEMO_KEY = "mla_decode"


class MLADecodeMetadata(NamedTuple):
    """Paged KV indices of a batch in CSR form: sequence i's pages (block ids) are
    kv_indices[kv_indptr[i] : kv_indptr[i + 1]], ceil(seq_lens[i] / block_size) of them."""

    kv_indptr: torch.Tensor  # [num_seqs + 1] int32
    kv_indices: torch.Tensor  # [>= num_seqs * max_blocks] int32; entries past kv_indptr[-1] unspecified


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
    plan_cache: the metadata's per-step memo (the gather plan is made once per step).
    Returns [num_tokens, heads, r] in query's dtype. Math runs in float32.
    """
    t, heads, width = query.shape
    if width != cache.shape[-1] or not 0 < kv_lora_rank < width:
        raise ValueError(f"mla_attention: query rows of {width} features, cache rows of {cache.shape[-1]}, "
                         f"kv_lora_rank {kv_lora_rank}: both rows must be kv_lora_rank + qk_rope_head_dim wide")
    if out is None:
        out = query.new_empty(t, heads, kv_lora_rank)
    cache_rows, pitch = slot_rows(cache)
    gathers = cached_plan(plan_cache, "reference.mla_attention", block_tables, seq_lens, query_start_loc,
                          cache.shape[1], pitch, None)
    for g in gathers:
        rows = _dequant(_gather(cache_rows, g.slots), cache_scale).unsqueeze(-2)  # [B, seq, 1, r + rope]
        q = query[g.rows].view(g.num_seqs, -1, heads, width)  # [B, n, heads, r + rope]
        out[g.rows] = _attend(q, rows, rows[..., :kv_lora_rank], g.mask, scale).flatten(0, 1).to(out.dtype)
    return out


def mla_kv_indices(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, kv_indptr: torch.Tensor,
                   kv_indices: torch.Tensor) -> None:
    """Fill the CSR page indices of a batch in place (see MLADecodeMetadata).

    Page ids (one per block of block_size rows), not flattened token slots: block_size times fewer entries to
    build and to read, and a kernel turns page + offset into a row as it does with a block table; with block
    size 1 (SGLang's token pool) the two are the same. kv_indptr [S + 1] int32 ← 0, cumsum of pages per
    sequence (in place, torch.cumsum(out=...)); kv_indices [>= S * max_blocks] int32.
    """
    pages = (seq_lens.long() + block_size - 1) // block_size  # [S]
    kv_indptr[:1].zero_()
    torch.cumsum(pages, 0, dtype=kv_indptr.dtype, out=kv_indptr[1:])
    keep = torch.arange(block_tables.shape[1], device=pages.device) < pages[:, None]  # [S, W]
    # Each row's live entries are a prefix, so the row-major selection is the CSR concatenation. (masked_select:
    # boolean-mask indexing of this 2-D table took milliseconds on CPU.)
    live = torch.masked_select(block_tables, keep)
    kv_indices[: live.numel()] = live.to(kv_indices.dtype)


def mla_decode_buffers(max_num_seqs: int, max_blocks: int, device) -> MLADecodeMetadata:
    """Persistent buffers for every step of up to max_num_seqs sequences of up to max_blocks blocks."""
    return MLADecodeMetadata(torch.empty(max_num_seqs + 1, dtype=torch.int32, device=device),
                             torch.empty(max_num_seqs * max_blocks, dtype=torch.int32, device=device))


def mla_decode_metadata(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                        plan_cache: dict | None = None, buffers: MLADecodeMetadata | None = None) -> MLADecodeMetadata:
    """The step's MLA decode metadata, made once a step (memo in plan_cache, the metadata's per-step memo): in
    `buffers` when the host keeps persistent ones (mla_decode_buffers: refilled in place, the same addresses
    every step, what a CUDA graph needs), else in fresh tensors. mla_kv_indices runs on the device's backend."""
    def make() -> MLADecodeMetadata:
        num_seqs, width = block_tables.shape
        if buffers is None:
            meta = mla_decode_buffers(num_seqs, width, block_tables.device)
        elif buffers.kv_indptr.shape[0] <= num_seqs or buffers.kv_indices.shape[0] < num_seqs * width:
            raise ValueError(f"MLA decode buffers for {buffers.kv_indptr.shape[0] - 1} sequences and "
                             f"{buffers.kv_indices.shape[0]} pages cannot hold a step of {num_seqs} sequences with "
                             f"{width}-wide block tables: size them by max_num_seqs and the widest block table")
        else:
            meta = MLADecodeMetadata(buffers.kv_indptr[:num_seqs + 1], buffers.kv_indices)
        dispatch.get("mla_kv_indices", block_tables.device)(block_tables, seq_lens, block_size, *meta)
        return meta

    return step_memo(plan_cache, (_MEMO_KEY, block_size), make)
