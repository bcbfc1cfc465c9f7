"""mla_attention: absorbed MLA over a paged latent cache for a varlen batch of prefills and decodes.

Same contract as atom_kernels.reference.mla.mla_attention. Sequences with one new token go to the split-KV
decode kernel (mla/decode.py, pages from the step's MLA decode metadata), the others to the prefill kernel
(mla/prefill.py, pages from the block table). The hints (max_query_len, max_seq_len, num_decodes,
num_prefills) only pick which kernels to launch and their tile/split sizes; grids come from tensor shapes,
so nothing syncs with the device and a hint that is only an upper bound (CUDA-graph capture) stays correct.
"""

from __future__ import annotations

import torch

from atom_kernels.reference.mla import mla_decode_metadata
from atom_kernels.triton._utils import FLOAT_DTYPES, check, check_dtype, check_same_device
from atom_kernels.triton.attention.common import softmax_scale, warm_up_batches
from atom_kernels.triton.attention.decode import decode_order
from atom_kernels.triton.mla.cache import check_cache_scale, check_latent_cache
from atom_kernels.triton.mla.decode import launch_mla_decode, mla_decode_config, resident_programs, wgmma_fits
from atom_kernels.triton.mla.prefill import launch_mla_prefill, mla_prefill_config


def check_mla_args(query, cache, block_tables, seq_lens, query_start_loc, kv_lora_rank, cache_scale, out) -> None:
    check(query.dim() == 3, f"query must be [tokens, heads, r + rope], got {tuple(query.shape)}")
    check_dtype("query", query, FLOAT_DTYPES)
    t, heads, width = query.shape
    check(0 < kv_lora_rank < width, f"kv_lora_rank {kv_lora_rank} must lie in (0, {width}): query rows are "
                                    "kv_lora_rank + qk_rope_head_dim wide")
    check_latent_cache(cache, width)
    check_cache_scale(cache_scale)
    num_seqs = seq_lens.shape[0]
    check(seq_lens.dim() == 1 and not seq_lens.is_floating_point(), "seq_lens must be int [num_seqs]")
    check(query_start_loc.shape == (num_seqs + 1,) and not query_start_loc.is_floating_point(),
          f"query_start_loc must be int [num_seqs + 1 = {num_seqs + 1}], got {tuple(query_start_loc.shape)}")
    check(block_tables.dim() == 2 and block_tables.shape[0] == num_seqs and not block_tables.is_floating_point(),
          f"block_tables must be int [num_seqs={num_seqs}, max_blocks], got {tuple(block_tables.shape)}")
    check(out.shape == (t, heads, kv_lora_rank), f"out must be [{t}, {heads}, {kv_lora_rank}], got {tuple(out.shape)}")
    check_dtype("out", out, FLOAT_DTYPES)
    check_same_device(query=query, cache=cache, block_tables=block_tables, seq_lens=seq_lens,
                      query_start_loc=query_start_loc, cache_scale=cache_scale, out=out)


def warm_up_shapes(max_model_len: int, max_tokens: int) -> list[tuple[list[int], list[int], int]]:
    """The batches a warm-up runs through mla_attention (mla_prefill_config and mla_decode_config bucket like the
    paged attention kernels): attention_common.warm_up_batches."""
    return warm_up_batches(max_model_len, max_tokens)


def mla_attention(query, cache, block_tables, seq_lens, query_start_loc, scale, kv_lora_rank, cache_scale=None,
                  out=None, plan_cache=None, decode_metadata=None, max_query_len=None, max_seq_len=None,
                  num_decodes=None, num_prefills=None) -> torch.Tensor:
    """query [T, heads, r + rope], cache [num_blocks, block_size, r + rope] (any strides) → out [T, heads, r].

    plan_cache: the metadata's per-step memo (the decode launch order is made once a step there, and so is the
    MLA decode metadata unless decode_metadata, the host's, is given). Hints are optional upper bounds; without
    them both kernels run. num_prefills is accepted for symmetry with the metadata but not needed.
    """
    if out is None:
        out = query.new_empty(*query.shape[:2], kv_lora_rank)
    check_mla_args(query, cache, block_tables, seq_lens, query_start_loc, kv_lora_rank, cache_scale, out)
    if query.shape[0] == 0 or seq_lens.shape[0] == 0:
        return out
    qk_scale = softmax_scale(scale)
    # A batch whose longest query is one token has no prefill; one with num_decodes == 0 leaves any one-token
    # first chunk to the prefill kernel.
    run_decode = num_decodes is None or num_decodes > 0 or max_query_len == 1
    if max_query_len is None or max_query_len > 1:
        cfg = mla_prefill_config(max_query_len, query.shape[1], kv_lora_rank, query.dtype)
        launch_mla_prefill(query, cache, block_tables, seq_lens, query_start_loc, qk_scale, kv_lora_rank,
                           cache_scale, out, skip_decodes=run_decode, **cfg)
    if run_decode:
        meta = decode_metadata
        if meta is None:
            meta = mla_decode_metadata(block_tables, seq_lens, cache.shape[1], plan_cache)
        longest = max_seq_len if max_seq_len is not None else block_tables.shape[1] * cache.shape[1]
        cfg = mla_decode_config(seq_lens.shape[0], query.shape[1], longest, query.device, query.dtype,
                                cache.dtype, wgmma_fits(query, cache, kv_lora_rank, out))
        # longest first where the grid (head groups, splits, sequences) is more than one wave
        order = decode_order(seq_lens, -(-query.shape[1] // cfg["block_h"]) * cfg["num_splits"],
                             resident_programs(cfg["wgmma"], query.device), plan_cache)
        launch_mla_decode(query, cache, *meta, seq_lens, query_start_loc, qk_scale, kv_lora_rank, cache_scale,
                          out, **cfg, order=order)
    return out
