"""A small batch as vLLM's runner describes it (CommonAttentionMetadata), its K/V, and an SDPA oracle."""

from __future__ import annotations

import torch

BLOCK, KV_HEADS, HEADS, D = 16, 2, 4, 32
NUM_BLOCKS = 64
# (cached context tokens, new tokens) per request, decodes first as vLLM orders them for our builder
REQUESTS = [(9, 1), (30, 1), (33, 1), (0, 13), (20, 7), (0, 2)]
# Padding vLLM adds to this 25-token batch in the padded tests: 30 rows split in two micro-batches at row
# 15, inside the 13-token prefill (rows 3..15)
PAD_TOKENS, PAD_REQS = 5, 2


def common_metadata(g: torch.Generator):
    """A CommonAttentionMetadata as vLLM's runner fills it: block tables, slots and positions per token."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    seq_lens = [c + q for c, q in REQUESTS]
    width = max(-(-s // BLOCK) for s in seq_lens)
    table = torch.randperm(NUM_BLOCKS, generator=g)[: width * len(REQUESTS)].view(len(REQUESTS), width)
    table = table.to(torch.int32)
    positions = torch.cat([torch.arange(c, c + q) for c, q in REQUESTS])
    req_of_token = torch.cat([torch.full((q,), r) for r, (_, q) in enumerate(REQUESTS)])
    slots = table[req_of_token, positions // BLOCK].long() * BLOCK + positions % BLOCK
    qsl = torch.tensor([0] + [q for _, q in REQUESTS]).cumsum(0).to(torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl.clone(), query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=len(REQUESTS),
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32),
        num_actual_tokens=int(qsl[-1]), max_query_len=max(q for _, q in REQUESTS),
        max_seq_len=max(seq_lens), block_table_tensor=table, slot_mapping=slots, positions=positions,
    )


def atom_builder():
    """Our metadata builder as vLLM makes it for a KV-cache group of this batch's shape: the group's layer made by
    the core's Attention factory (which attaches the builder vLLM's AtomMetadataBuilder then uses)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from atom_core.layers.attention import Attention
    from atom_frontends.vllm.hooks import VLLM
    from atom_frontends.vllm.metadata import AtomMetadataBuilder

    cfg, prefix = VllmConfig(), "model.layers.0.self_attn.attn"
    with set_current_vllm_config(cfg), VLLM.scope():
        Attention(HEADS, D, D**-0.5, KV_HEADS, prefix=prefix)  # registers itself in cfg's forward context
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=D, dtype=torch.float32)
    return AtomMetadataBuilder(spec, [prefix], cfg, torch.device("cpu"))


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, width] with PAD_TOKENS padding rows below, as vLLM's persistent input buffers hand them over
    (stale values; NaN here, so that any use of them shows)."""
    return torch.cat([x, x.new_full((PAD_TOKENS, x.shape[1]), float("nan"))])


# How vLLM 0.32's GPU runners pad a step: the model's inputs always have num_tokens_padded rows. Under
# piecewise CUDA graphs or data-parallel padding the metadata stays unpadded ("tokens"), except that
# slot_mapping (-1) and positions (stale) cover the padding rows too ("tokens+slots": the V1 runner
# pads slot_mapping when another KV-cache group's backend writes the cache outside forward, the V2
# runner, vllm/v1/worker/gpu, always). Under full CUDA graphs ("full", both runners) the metadata is
# padded too: PAD_REQS requests with no tokens (query_start_loc repeats its last value, seq_len 0, the
# null block 0), slot -1 and stale positions for the padding rows, num_actual_tokens counting them.
PAD_MODES = ["tokens", "tokens+slots", "full"]


def pad_metadata(common, mode: str):
    """common (unpadded) → the CommonAttentionMetadata vLLM hands the builder for a step padded by PAD_TOKENS."""
    slots = torch.cat([common.slot_mapping, torch.full((PAD_TOKENS,), -1, dtype=common.slot_mapping.dtype)])
    positions = torch.cat([common.positions, common.positions.new_full((PAD_TOKENS,), 7)])
    if mode == "tokens":
        return common
    if mode == "tokens+slots":
        return common.replace(slot_mapping=slots, positions=positions)
    qsl = torch.cat([common.query_start_loc, common.query_start_loc[-1:].repeat(PAD_REQS)])
    seq_lens = torch.cat([common.seq_lens, common.seq_lens.new_zeros(PAD_REQS)])
    table = common.block_table_tensor
    return common.replace(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens,
        seq_lens_cpu_upper_bound=seq_lens.clone(), num_reqs=common.num_reqs + PAD_REQS,
        num_actual_tokens=common.num_actual_tokens + PAD_TOKENS,
        block_table_tensor=torch.cat([table, table.new_zeros(PAD_REQS, table.shape[1])]), slot_mapping=slots,
        positions=positions,
    )


def vllm_kv_cache(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """vLLM's per-layer view for its default token-major (LBNHC) layout: logical
    [blocks, kv_heads, block_size, 2*d] (K then V on the last dim), physically [blocks, block_size, kv_heads, 2*d].
    dtype torch.uint8 is how vLLM allocates an fp8 cache."""
    return torch.zeros(NUM_BLOCKS, BLOCK, KV_HEADS, 2 * D, dtype=dtype).transpose(1, 2)


def with_step_written(kv_cache: torch.Tensor, common, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A copy of a float kv_cache holding this step's key/value [T, kv_heads*d] at the slots of common (the
    unpadded metadata), and nothing else changed: what the cache must be after the step."""
    want = kv_cache.clone()
    slots = common.slot_mapping
    want[slots // BLOCK, :, slots % BLOCK, :D] = key.view(-1, KV_HEADS, D).to(want.dtype)
    want[slots // BLOCK, :, slots % BLOCK, D:] = value.view(-1, KV_HEADS, D).to(want.dtype)
    return want


def _stored(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """What the cache holds for x, as float32: x rounded to fp8 e4m3 (scale 1) for a uint8 (fp8) cache, to
    the cache's dtype otherwise."""
    return x.to(torch.float8_e4m3fn if cache.dtype == torch.uint8 else cache.dtype).float()


def fill_step(kv_cache: torch.Tensor, common, g: torch.Generator):
    """Write each request's cached prefix into kv_cache (as earlier steps did); return this step's
    query [T, heads*d], key/value [T, kv_heads*d] and every request's K/V as the cache holds them
    [ctx+new, kv_heads, d] (the attention oracle's input)."""
    k_all = [torch.randn(c + n, KV_HEADS, D, generator=g) for c, n in REQUESTS]
    v_all = [torch.randn(c + n, KV_HEADS, D, generator=g) for c, n in REQUESTS]
    target = kv_cache.view(torch.float8_e4m3fn) if kv_cache.dtype == torch.uint8 else kv_cache
    table = common.block_table_tensor.long()
    for r, (c, _) in enumerate(REQUESTS):
        pos = torch.arange(c)
        target[table[r, pos // BLOCK], :, pos % BLOCK, :D] = k_all[r][:c].to(target.dtype)
        target[table[r, pos // BLOCK], :, pos % BLOCK, D:] = v_all[r][:c].to(target.dtype)
    key = torch.cat([k[c:] for k, (c, _) in zip(k_all, REQUESTS)]).reshape(-1, KV_HEADS * D)
    value = torch.cat([v[c:] for v, (c, _) in zip(v_all, REQUESTS)]).reshape(-1, KV_HEADS * D)
    query = torch.randn(key.shape[0], HEADS * D, generator=g)
    if kv_cache.dtype == torch.bfloat16:  # a bf16 model: this step's tensors are bf16 too
        query, key, value = query.bfloat16(), key.bfloat16(), value.bfloat16()
    return query, key, value, [_stored(k, kv_cache) for k in k_all], [_stored(v, kv_cache) for v in v_all]


def sdpa_reference(query, k_all, v_all, scale):
    """Per request: causal attention of its new queries (its last rows) over all its tokens, by torch SDPA."""
    q = query.view(-1, HEADS, D)
    outs, start = [], 0
    for r, (c, n) in enumerate(REQUESTS):
        qr = q[start : start + n].transpose(0, 1)  # [heads, n, d]
        kr = k_all[r].transpose(0, 1).repeat_interleave(HEADS // KV_HEADS, 0)  # [heads, c+n, d]
        vr = v_all[r].transpose(0, 1).repeat_interleave(HEADS // KV_HEADS, 0)
        mask = torch.arange(c + n)[None, :] <= torch.arange(c, c + n)[:, None]
        out = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=scale)
        outs.append(out.transpose(0, 1).reshape(n, HEADS * D))
        start += n
    return torch.cat(outs)
