"""MLA reference ops (write_latent_cache, mla_attention) against naive dense attention written here: a varlen
batch of decodes and prefills over cached prefixes, a paged cache with shuffled blocks, padding slots, host cache
views (vLLM's 4-D latent view), an fp8 cache with a scale; and the absorbed form against the expanded one
(per-head K = W_UK·latent + shared rope key, V = W_UV·latent), the maths transformers' DeepSeek runs."""

from __future__ import annotations

import pytest
import torch

from atom_kernels import reference as ref

R, ROPE, HEADS, BLOCK = 16, 8, 4, 4
# (context length incl. new tokens, new tokens): decodes, a prefill over a cached prefix, a fresh prefill
SEQS = [(9, 1), (14, 5), (1, 1), (7, 7), (22, 1)]


def _batch(seed: int = 0, num_blocks: int = 24):
    """Per-sequence latents [len, D], a shuffled block table, and the step's metadata."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=g)
    width = -(-max(n for n, _ in SEQS) // BLOCK)
    tables = torch.full((len(SEQS), width), -1, dtype=torch.int32)
    latents, used = [], 0
    for i, (n, _) in enumerate(SEQS):
        need = -(-n // BLOCK)
        tables[i, :need] = perm[used:used + need].int()
        used += need
        latents.append(torch.randn(n, R + ROPE, generator=g))
    q_lens = [q for _, q in SEQS]
    qsl = torch.tensor([0] + q_lens).cumsum(0).int()
    query = torch.randn(sum(q_lens), HEADS, R + ROPE, generator=g)
    return latents, tables, torch.tensor([n for n, _ in SEQS], dtype=torch.int32), qsl, query


def _slots(tables: torch.Tensor, i: int, positions: range) -> torch.Tensor:
    return torch.tensor([int(tables[i, p // BLOCK]) * BLOCK + p % BLOCK for p in positions])


def _fill(cache, latents, tables, scale=None):
    """Cached prefixes first (an earlier step), then this step's new tokens with padding rows in between."""
    for i, (n, q) in enumerate(SEQS):
        if n > q:
            ref.write_latent_cache(latents[i][: n - q], cache, _slots(tables, i, range(n - q)), scale)
    rows, slots = [], []
    for i, (n, q) in enumerate(SEQS):
        rows += [latents[i][n - q:], torch.full((1, R + ROPE), float("nan"))]  # a NaN padding row, slot -1
        slots += [_slots(tables, i, range(n - q, n)), torch.tensor([-1])]
    ref.write_latent_cache(torch.cat(rows), cache, torch.cat(slots), scale)


def _naive(query, latents, scale):
    """Dense per-sequence attention: queries at the last positions; keys = whole rows, values = first R."""
    outs, start = [], 0
    for (n, q), lat in zip(SEQS, latents):
        qs = query[start:start + q]  # [q, H, D]
        logits = torch.einsum("qhd,kd->hqk", qs.double(), lat.double()) * scale
        q_pos = torch.arange(n - q, n).view(1, -1, 1)
        logits = logits.masked_fill(torch.arange(n).view(1, 1, -1) > q_pos, float("-inf"))
        outs.append(torch.einsum("hqk,kr->qhr", logits.softmax(-1), lat[:, :R].double()))
        start += q
    return torch.cat(outs).float()


def test_mla_attention_matches_naive_dense_attention():
    latents, tables, seq_lens, qsl, query = _batch()
    cache = torch.zeros(24, BLOCK, R + ROPE)
    _fill(cache, latents, tables)
    scratch: dict = {}
    got = ref.mla_attention(query, cache, tables, seq_lens, qsl, 0.3, R, plan_cache=scratch)
    want = _naive(query, latents, 0.3)
    assert got.shape == (query.shape[0], HEADS, R)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the plan made once is reused (a second layer of the same step): same answer
    torch.testing.assert_close(ref.mla_attention(query, cache, tables, seq_lens, qsl, 0.3, R, plan_cache=scratch),
                               want, rtol=1e-5, atol=1e-5)


def test_vllm_latent_view_is_read_and_written_in_place():
    """vLLM hands an MLA layer [blocks, 1, block_size, r + rope]; its head-0 view is our [blocks, bs, D]."""
    latents, tables, seq_lens, qsl, query = _batch(seed=1)
    storage = torch.zeros(24, 1, BLOCK, R + ROPE)
    _fill(storage[:, 0], latents, tables)
    got = ref.mla_attention(query, storage[:, 0], tables, seq_lens, qsl, 0.25, R)
    torch.testing.assert_close(got, _naive(query, latents, 0.25), rtol=1e-5, atol=1e-5)


def test_fp8_cache_with_scale():
    latents, tables, seq_lens, qsl, query = _batch(seed=2)
    scale = torch.tensor(0.05)
    cache = torch.zeros(24, BLOCK, R + ROPE, dtype=torch.float8_e4m3fn)
    _fill(cache, latents, tables, scale)
    stored = [(lat / scale).to(torch.float8_e4m3fn).float() * scale for lat in latents]
    got = ref.mla_attention(query, cache, tables, seq_lens, qsl, 0.3, R, cache_scale=scale)
    torch.testing.assert_close(got, _naive(query, stored, 0.3), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(stored[0], latents[0])  # the comparison above saw fp8 rounding


def test_padding_slots_write_nothing():
    cache = torch.zeros(2, BLOCK, R + ROPE)
    rows = torch.randn(3, R + ROPE)
    ref.write_latent_cache(rows, cache, torch.tensor([5, -1, 0]))
    torch.testing.assert_close(cache[1, 1], rows[0])
    torch.testing.assert_close(cache[0, 0], rows[2])
    assert int((cache.abs().sum(-1) > 0).sum()) == 2


def test_absorbed_form_equals_expanded_attention():
    """Our op + W_UV == multi-head attention with K/V expanded from the latents (transformers' DeepSeek form)."""
    nope, v_dim = 6, 5
    latents, tables, seq_lens, qsl, _ = _batch(seed=3)
    g = torch.Generator().manual_seed(4)
    w_uk, w_uv = torch.randn(HEADS, nope, R, generator=g), torch.randn(HEADS, v_dim, R, generator=g)
    q_nope = torch.randn(int(qsl[-1]), HEADS, nope, generator=g)
    q_pe = torch.randn(int(qsl[-1]), HEADS, ROPE, generator=g)
    cache = torch.zeros(24, BLOCK, R + ROPE)
    _fill(cache, latents, tables)
    q_latent = torch.cat([torch.einsum("thn,hnr->thr", q_nope, w_uk), q_pe], dim=-1)
    out = ref.mla_attention(q_latent, cache, tables, seq_lens, qsl, 0.2, R)
    got = torch.einsum("thr,hvr->thv", out, w_uv)
    start = 0
    for (n, q), lat in zip(SEQS, latents):
        k = torch.cat([torch.einsum("hnr,kr->hkn", w_uk, lat[:, :R]), lat[:, R:].expand(HEADS, n, ROPE)], -1)
        v = torch.einsum("hvr,kr->hkv", w_uv, lat[:, :R])
        qs = torch.cat([q_nope, q_pe], -1)[start:start + q].transpose(0, 1)  # [H, q, nope + rope]
        mask = torch.arange(n).view(1, -1) <= torch.arange(n - q, n).view(-1, 1)
        want = torch.nn.functional.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=0.2)
        torch.testing.assert_close(got[start:start + q], want.transpose(0, 1), rtol=1e-4, atol=1e-4)
        start += q


def test_mismatched_widths_are_refused():
    _, tables, seq_lens, qsl, query = _batch()
    with pytest.raises(ValueError, match="kv_lora_rank"):
        ref.mla_attention(query, torch.zeros(24, BLOCK, R), tables, seq_lens, qsl, 0.3, R)
