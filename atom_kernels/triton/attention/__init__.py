"""paged_attention: one varlen batch of prefills (over cached prefixes) and decodes, paged strided K/V.

Same contract as atom_kernels.reference.attention.paged_attention. Sequences with one new token go
to the split-KV decode kernel, the others to the prefill kernel. The hints (max_query_len,
max_seq_len, num_decodes, num_prefills) only pick which kernels to launch and their tile/split
sizes; grids are sized from tensor shapes, so nothing here syncs with the device, and a hint that
is merely an upper bound (CUDA-graph capture) stays correct.
"""

from __future__ import annotations

import torch

from atom_kernels.triton._utils import FLOAT_DTYPES, check, check_dtype, check_same_device, has_scales
from atom_kernels.triton.attention.common import softmax_scale, warm_up_batches
from atom_kernels.triton.attention.decode import decode_config, decode_order, decode_slots, launch_decode
from atom_kernels.triton.attention.prefill import launch_prefill, prefill_config
from atom_kernels.triton.kv_cache import check_caches


def check_attention_args(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out) -> None:
    check(query.dim() == 3, f"query must be [tokens, heads, head_dim], got {tuple(query.shape)}")
    check_dtype("query", query, FLOAT_DTYPES)
    _, heads, head_dim = query.shape
    check(k_cache.dim() == 4,
          f"k_cache must be [num_blocks, block_size, kv_heads, head_dim], got {tuple(k_cache.shape)}")
    kv_heads = k_cache.shape[2]
    check_caches(k_cache, v_cache, kv_heads, head_dim)
    check(heads % kv_heads == 0, f"query heads {heads} not a multiple of kv heads {kv_heads}")
    num_seqs = seq_lens.shape[0]
    check(seq_lens.dim() == 1 and not seq_lens.is_floating_point(), "seq_lens must be int [num_seqs]")
    check(query_start_loc.shape == (num_seqs + 1,) and not query_start_loc.is_floating_point(),
          f"query_start_loc must be int [num_seqs + 1 = {num_seqs + 1}], got {tuple(query_start_loc.shape)}")
    check(block_tables.dim() == 2 and block_tables.shape[0] == num_seqs
          and not block_tables.is_floating_point(),
          f"block_tables must be int [num_seqs={num_seqs}, max_blocks], got {tuple(block_tables.shape)}")
    check(out.shape == query.shape, f"out shape {tuple(out.shape)} != query shape {tuple(query.shape)}")
    check_dtype("out", out, FLOAT_DTYPES)
    check_same_device(query=query, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                      seq_lens=seq_lens, query_start_loc=query_start_loc, out=out)


def warm_up_shapes(max_model_len: int, max_tokens: int) -> list[tuple[list[int], list[int], int]]:
    """The batches a warm-up runs through paged_attention (prefill_config and decode_config bucket by powers of
    two): attention_common.warm_up_batches."""
    return warm_up_batches(max_model_len, max_tokens)


def paged_attention(
    query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
    sliding_window=None, k_scale=None, v_scale=None, out=None,
    max_query_len=None, max_seq_len=None, num_decodes=None, num_prefills=None, plan_cache=None,
) -> torch.Tensor:
    """query [T, heads, d]; caches [num_blocks, block_size, kv_heads, d] (any strides) → out [T, heads, d].

    Hints are optional upper bounds from the metadata; without them both kernels are launched.
    num_prefills is accepted for symmetry with the metadata but not needed. plan_cache: the step's memo
    (AttentionMetadata.plan_cache), where the decode launch order is made once for every layer.
    """
    if out is None:
        out = torch.empty_like(query)
    check_attention_args(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out)
    scaled = has_scales(k_scale, v_scale)
    check_same_device(query=query, k_scale=k_scale, v_scale=v_scale)
    if query.shape[0] == 0 or seq_lens.shape[0] == 0:
        return out
    window = int(sliding_window) if sliding_window is not None and sliding_window > 0 else 0
    qk_scale = softmax_scale(scale)
    ks, vs = (k_scale, v_scale) if scaled else (None, None)
    args = (query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, qk_scale, window, ks, vs, out)
    # A batch whose longest query is one token has no prefill; one with num_decodes == 0 leaves any
    # one-token first chunk to the prefill kernel.
    run_decode = num_decodes is None or num_decodes > 0 or max_query_len == 1
    if max_query_len is None or max_query_len > 1:
        group = query.shape[1] // k_cache.shape[2]
        cfg = prefill_config(max_query_len, query.shape[2], query.dtype == torch.float32, group)
        launch_prefill(*args, skip_decodes=run_decode, **cfg)
    if run_decode:
        longest = max_seq_len if max_seq_len is not None else block_tables.shape[1] * k_cache.shape[1]
        cfg = decode_config(seq_lens.shape[0], k_cache.shape[2], longest, query.shape[2], query.device,
                            k_cache.dtype, query.dtype)
        order = decode_order(seq_lens, k_cache.shape[2] * cfg["num_splits"], decode_slots(query.device), plan_cache)
        launch_decode(*args, **cfg, order=order)
    return out
