"""The metadata builder on a real CommonAttentionMetadata mixing decodes and prefills (some over a cached
prefix), checked against vLLM's own batch split, for zero copies, and end to end: attention through
the built metadata on a KV cache in vLLM's per-layer layout == torch SDPA on the same K/V."""

from __future__ import annotations

import pytest
import torch

vllm_backend = pytest.importorskip("vllm.v1.attention.backend")

BLOCK, KV_HEADS, HEADS, D = 16, 2, 4, 32
# (cached context tokens, new tokens) per request, decodes first as vLLM orders them for our builder
REQUESTS = [(9, 1), (30, 1), (33, 1), (0, 13), (20, 7), (0, 2)]


def _common_metadata(num_blocks: int, g: torch.Generator):
    """A CommonAttentionMetadata as vLLM's runner fills it: block tables, slots and positions per token."""
    seq_lens = [c + q for c, q in REQUESTS]
    width = max(-(-s // BLOCK) for s in seq_lens)
    ids = torch.randperm(num_blocks, generator=g)[: width * len(REQUESTS)].view(len(REQUESTS), width)
    table = ids.to(torch.int32)
    positions = torch.cat([torch.arange(c, c + q) for c, q in REQUESTS])
    req_of_token = torch.cat([torch.full((q,), r) for r, (_, q) in enumerate(REQUESTS)])
    slots = table[req_of_token, positions // BLOCK].long() * BLOCK + positions % BLOCK
    qsl = torch.tensor([0] + [q for _, q in REQUESTS]).cumsum(0).to(torch.int32)
    return vllm_backend.CommonAttentionMetadata(
        query_start_loc=qsl.clone(), query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=len(REQUESTS),
        num_actual_tokens=int(qsl[-1]), max_query_len=max(q for _, q in REQUESTS),
        max_seq_len=max(seq_lens), block_table_tensor=table, slot_mapping=slots, positions=positions,
    )


def _builder():
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from atom_frontends.vllm.metadata import AtomMetadataBuilder

    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=D, dtype=torch.float32)
    return AtomMetadataBuilder(spec, ["model.layers.0.self_attn.attn"], VllmConfig(), torch.device("cpu"))


def test_counts_match_vllms_own_split_and_nothing_is_copied():
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    common = _common_metadata(64, torch.Generator().manual_seed(0))
    builder = _builder()
    assert builder.reorder_batch_threshold == 1  # vLLM puts decodes first for us
    md = builder.build(0, common)
    num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens = split_decodes_and_prefills(common, 1)
    assert (md.num_decodes, md.num_prefills) == (num_decodes, num_prefills) == (3, 3)
    assert (md.num_decode_tokens, md.num_prefill_tokens) == (num_decode_tokens, num_prefill_tokens)
    assert (md.max_query_len, md.max_seq_len, md.block_size) == (13, 34, BLOCK)
    for ours, theirs in [(md.slot_mapping, common.slot_mapping), (md.block_tables, common.block_table_tensor),
                         (md.seq_lens, common.seq_lens), (md.query_start_loc, common.query_start_loc),
                         (md.positions, common.positions)]:
        assert ours.data_ptr() == theirs.data_ptr() and ours.dtype == theirs.dtype  # views, no copies


def test_positions_derived_on_device_when_the_runner_gives_none():
    common = _common_metadata(64, torch.Generator().manual_seed(1))
    expected = common.positions.clone()
    md = _builder().build(0, common.replace(positions=None))
    assert torch.equal(md.positions, expected)


def _sdpa_reference(q, k_all, v_all, scale):
    """Per request: causal attention of its new queries (the last rows) over all its tokens, via SDPA."""
    outs, start = [], 0
    for r, (c, n) in enumerate(REQUESTS):
        qr = q[start : start + n].transpose(0, 1)  # [heads, n, d]
        kr = k_all[r].transpose(0, 1).repeat_interleave(HEADS // KV_HEADS, 0)  # [heads, c+n, d]
        vr = v_all[r].transpose(0, 1).repeat_interleave(HEADS // KV_HEADS, 0)
        mask = torch.arange(c + n)[None, :] <= torch.arange(c, c + n)[:, None]
        outs.append(torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=scale)
                    .transpose(0, 1).reshape(n, HEADS * D))
        start += n
    return torch.cat(outs)


def test_attention_through_built_metadata_matches_sdpa_on_vllm_layout():
    from atom_frontends.vllm.backend import AtomAttentionImpl

    g = torch.Generator().manual_seed(2)
    num_blocks = 64
    common = _common_metadata(num_blocks, g)
    # vLLM's per-layer view for its default (token-major, LBNHC) layout: logical
    # [blocks, kv_heads, block_size, 2*d], physically [blocks, block_size, kv_heads, 2*d].
    kv_cache = torch.zeros(num_blocks, BLOCK, KV_HEADS, 2 * D).transpose(1, 2)
    k_all = [torch.randn(c + n, KV_HEADS, D, generator=g) for c, n in REQUESTS]
    v_all = [torch.randn(c + n, KV_HEADS, D, generator=g) for c, n in REQUESTS]
    table = common.block_table_tensor.long()
    for r, (c, _) in enumerate(REQUESTS):  # the cached prefix, as earlier steps left it in the cache
        pos = torch.arange(c)
        kv_cache[table[r, pos // BLOCK], :, pos % BLOCK, :D] = k_all[r][:c]
        kv_cache[table[r, pos // BLOCK], :, pos % BLOCK, D:] = v_all[r][:c]
    key = torch.cat([k[c:] for k, (c, _) in zip(k_all, REQUESTS)]).reshape(-1, KV_HEADS * D)
    value = torch.cat([v[c:] for v, (c, _) in zip(v_all, REQUESTS)]).reshape(-1, KV_HEADS * D)
    query = torch.randn(key.shape[0], HEADS * D, generator=g)
    scale = D**-0.5

    md = _builder().build(0, common)
    impl = AtomAttentionImpl(HEADS, D, scale, KV_HEADS, prefix="model.layers.0.self_attn.attn")
    out = torch.full_like(query, float("nan"))
    impl.forward(None, query, key, value, kv_cache, md, out)

    torch.testing.assert_close(out, _sdpa_reference(query.view(-1, HEADS, D), k_all, v_all, scale))
    slots = common.slot_mapping  # this step's K/V landed in vLLM's cache at the runner's slots
    cached = kv_cache[slots // BLOCK, :, slots % BLOCK]  # [T, kv_heads, 2*d]
    torch.testing.assert_close(cached[..., :D].reshape_as(key), key)
    torch.testing.assert_close(cached[..., D:].reshape_as(value), value)
