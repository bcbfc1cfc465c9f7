"""The metadata builder on a real CommonAttentionMetadata mixing decodes and prefills (some over a cached
prefix), checked against vLLM's own batch split (padded steps too), for zero copies, and end to end: attention through
the built metadata on a KV cache in vLLM's per-layer layout (float32, bfloat16, fp8) == torch SDPA on
the same K/V."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from tests.frontends.vllm.batch import (  # noqa: E402
    BLOCK,
    HEADS,
    KV_HEADS,
    PAD_MODES,
    REQUESTS,
    D,
    atom_builder,
    common_metadata,
    fill_step,
    pad_metadata,
    sdpa_reference,
    vllm_kv_cache,
)


def test_counts_match_vllms_own_split_and_nothing_is_copied():
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    common = common_metadata(torch.Generator().manual_seed(0))
    builder = atom_builder()
    assert builder.reorder_batch_threshold == 1  # vLLM puts decodes first for us
    md = builder.build(0, common)
    num_decodes, num_prefills, _, _ = split_decodes_and_prefills(common, 1)
    assert (md.num_decodes, md.num_prefills) == (num_decodes, num_prefills) == (3, 3)
    assert (md.max_query_len, md.max_seq_len) == (13, 34)
    for ours, theirs in [(md.slot_mapping, common.slot_mapping), (md.block_tables, common.block_table_tensor),
                         (md.seq_lens, common.seq_lens), (md.query_start_loc, common.query_start_loc),
                         (md.positions, common.positions)]:
        assert ours.data_ptr() == theirs.data_ptr() and ours.dtype == theirs.dtype  # views, no copies


@pytest.mark.parametrize("mode", PAD_MODES)
def test_padded_metadata_covers_the_real_tokens_and_requests_only(mode):
    """vLLM's padding rows and padding requests (query length 0) are no tokens, decodes or prefills: the
    counts equal vLLM's own split of the step unpadded (CommonAttentionMetadata.unpadded)."""
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    common = common_metadata(torch.Generator().manual_seed(4))
    real_tokens, real_reqs = common.num_actual_tokens, common.num_reqs
    md = atom_builder().build(0, pad_metadata(common, mode))
    want = split_decodes_and_prefills(common.unpadded(real_tokens, real_reqs), 1)
    assert (md.num_decodes, md.num_prefills, md.num_decodes, md.num_tokens - md.num_decodes) == want == (3, 3, 3, 22)
    assert md.num_tokens == real_tokens
    assert torch.equal(md.slot_mapping, common.slot_mapping) and torch.equal(md.positions, common.positions)
    # vLLM's micro-batch metadata carries no positions: derived for the real tokens only
    derived = atom_builder().build(0, pad_metadata(common, mode).replace(positions=None)).positions
    assert torch.equal(derived, common.positions)


def test_positions_derived_on_device_when_the_runner_gives_none():
    common = common_metadata(torch.Generator().manual_seed(1))
    expected = common.positions.clone()
    md = atom_builder().build(0, common.replace(positions=None))
    assert torch.equal(md.positions, expected)


@pytest.mark.parametrize("kv_cache_dtype, model_dtype", [("auto", torch.float32), ("auto", torch.bfloat16),
                                                         ("fp8", torch.float32)])
def test_attention_through_built_metadata_matches_sdpa_on_vllm_layout(kv_cache_dtype, model_dtype):
    from atom_frontends.vllm.backend import AtomAttentionImpl

    g = torch.Generator().manual_seed(2)
    common = common_metadata(g)
    # vLLM allocates fp8 caches as uint8 bytes (its STR_DTYPE_TO_TORCH_DTYPE)
    kv_cache = vllm_kv_cache(torch.uint8 if kv_cache_dtype == "fp8" else model_dtype)
    query, key, value, k_all, v_all = fill_step(kv_cache, common, g)
    md = atom_builder().build(0, common)
    impl = AtomAttentionImpl(HEADS, D, D**-0.5, KV_HEADS, kv_cache_dtype=kv_cache_dtype,
                             prefix="model.layers.0.self_attn.attn")
    layer = SimpleNamespace(_k_scale=torch.tensor(1.0), _v_scale=torch.tensor(1.0))  # AttentionForVllm's
    out = torch.full_like(query, float("nan"))
    impl.forward(layer, query, key, value, kv_cache, md, out)

    # the oracle: fp32 SDPA on the values the cache holds; bf16 output rounds once (and its query is bf16)
    want = sdpa_reference(query.float(), k_all, v_all, D**-0.5)
    tol = 1e-5 if model_dtype == torch.float32 else 1e-2
    assert out.dtype == model_dtype
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)
    slots = common.slot_mapping  # this step's K/V landed in vLLM's cache at the runner's slots
    stored = (kv_cache.view(torch.float8_e4m3fn) if kv_cache_dtype == "fp8" else kv_cache).float()
    cached = stored[slots // BLOCK, :, slots % BLOCK]  # [T, kv_heads, 2*d]
    new_k = torch.cat([k[c:] for k, (c, _) in zip(k_all, REQUESTS)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(v_all, REQUESTS)])
    torch.testing.assert_close(cached[..., :D], new_k, atol=0, rtol=0)  # stored exactly as the cache rounds
    torch.testing.assert_close(cached[..., D:], new_v, atol=0, rtol=0)
