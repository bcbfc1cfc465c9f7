"""Torch reference kernels against independent formulations (SDPA, transformers modules)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from atom_kernels import reference as ref


def _paged(k, v, block_size, g):
    """Scatter contiguous per-sequence K/V [seq, kvh, d] into a shuffled paged cache; return caches + table."""
    seq = k.shape[0]
    nblocks = -(-seq // block_size)
    total = nblocks + 3
    perm = torch.randperm(total, generator=g)[:nblocks]
    kc = torch.full((total, block_size, *k.shape[1:]), float("nan"))
    vc = kc.clone()
    slots = torch.cat([perm[i // block_size : i // block_size + 1] * block_size + i % block_size
                       for i in range(seq)])
    ref.write_kv_cache(k, v, kc, vc, slots)
    return kc, vc, perm


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("window", [None, 5])
def test_paged_attention_matches_sdpa(block_size, heads, kv_heads, window):
    g = torch.Generator().manual_seed(block_size * 100 + heads + (window or 0))
    d = 16
    seqs = [(9, 9), (20, 1), (13, 6), (1, 1)]  # (context length, new query tokens): prefills, decodes, prefix
    qs, outs_expected, caches = [], [], []
    for seq_len, q_len in seqs:
        q = torch.randn(q_len, heads, d, generator=g)
        k = torch.randn(seq_len, kv_heads, d, generator=g)
        v = torch.randn(seq_len, kv_heads, d, generator=g)
        pos_q = torch.arange(seq_len - q_len, seq_len)[:, None]
        pos_k = torch.arange(seq_len)[None, :]
        allowed = pos_k <= pos_q
        if window:
            allowed &= pos_k > pos_q - window
        exp = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1).repeat_interleave(heads // kv_heads, 0),
            v.transpose(0, 1).repeat_interleave(heads // kv_heads, 0), attn_mask=allowed, scale=0.3)
        qs.append(q)
        outs_expected.append(exp.transpose(0, 1))
        caches.append(_paged(k, v, block_size, g))
    # one shared cache: concatenate the per-sequence caches and offset block ids
    kc = torch.cat([c[0] for c in caches])
    vc = torch.cat([c[1] for c in caches])
    offsets = torch.tensor([0] + [c[0].shape[0] for c in caches[:-1]]).cumsum(0)
    width = max(len(c[2]) for c in caches)
    table = torch.zeros(len(seqs), width, dtype=torch.int32)
    for i, c in enumerate(caches):
        table[i, : len(c[2])] = c[2] + offsets[i]
    qsl = torch.tensor([0] + [q for _, q in seqs]).cumsum(0).int()
    lens = torch.tensor([s for s, _ in seqs]).int()
    out = ref.paged_attention(torch.cat(qs), kc, vc, table, lens, qsl, 0.3, sliding_window=window)
    torch.testing.assert_close(out, torch.cat(outs_expected), rtol=1e-5, atol=1e-5)
    # A step's plan made by one layer (with or without a window) and reused by the next layers.
    plan_cache = {}
    other = None if window else 5
    ref.paged_attention(torch.cat(qs), kc, vc, table, lens, qsl, 0.3, sliding_window=other, plan_cache=plan_cache)
    for _ in range(2):
        out = ref.paged_attention(torch.cat(qs), kc, vc, table, lens, qsl, 0.3, sliding_window=window,
                                  plan_cache=plan_cache)
        torch.testing.assert_close(out, torch.cat(outs_expected), rtol=1e-5, atol=1e-5)
    assert len(plan_cache) == 2  # one plan per (block size, window), made once


def test_write_kv_cache_skips_padding_and_reads_strided_views():
    # vLLM-like layout: [blocks, kv_heads, block_size, 2*d] viewed as logical [blocks, block_size, kv_heads, d]
    raw = torch.zeros(4, 2, 8, 2 * 16)
    k_view = raw[..., :16].permute(0, 2, 1, 3)
    v_view = raw[..., 16:].permute(0, 2, 1, 3)
    k, v = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    ref.write_kv_cache(k, v, k_view, v_view, torch.tensor([9, -1, 31]))
    torch.testing.assert_close(raw[1, :, 1, :16], k[0])
    torch.testing.assert_close(raw[3, :, 7, 16:], v[2])
    assert int((raw != 0).sum()) == 4 * 2 * 16  # two tokens' K and V, nothing for the padding slot


def test_fp8_cache_round_trip_with_scales():
    k, v = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    kc = torch.zeros(2, 4, 2, 16, dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    ks, vs = torch.tensor(0.05), torch.tensor(0.02)
    ref.write_kv_cache(k, v, kc, vc, torch.arange(5), ks, vs)
    got = kc.reshape(-1, 2, 16)[:5].float() * ks
    torch.testing.assert_close(got, k, rtol=0.07, atol=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_transformers(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x, res = torch.randn(7, 48, dtype=dtype), torch.randn(7, 48, dtype=dtype)
    m = LlamaRMSNorm(48, eps=1e-5).to(dtype)
    m.weight.data = torch.randn(48, dtype=dtype)
    torch.testing.assert_close(ref.rms_norm(x, m.weight, 1e-5), m(x), rtol=0, atol=0)
    out, new_res = ref.rms_norm(x, m.weight, 1e-5, res)
    torch.testing.assert_close(new_res, x + res, rtol=0, atol=0)
    torch.testing.assert_close(out, m(x + res), rtol=0, atol=0)


def test_silu_and_mul():
    x = torch.randn(5, 2 * 24)
    torch.testing.assert_close(ref.silu_and_mul(x), F.silu(x[:, :24]) * x[:, 24:])


def test_rotary_matches_transformers():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from atom_core.layers.rotary import get_rope

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=128)
    rope = get_rope(cfg, 16, 128)
    pos = torch.tensor([0, 5, 77, 127, 3])
    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    cos, sin = LlamaRotaryEmbedding(cfg)(q, pos[None])
    q_exp, k_exp = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    q_got, k_got = ref.rotary(pos, q, k, rope.cos_sin_cache)
    torch.testing.assert_close(q_got, q_exp[0].transpose(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(k_got, k_exp[0].transpose(0, 1), rtol=0, atol=0)


@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_float64_matmul_and_packs_nothing(bias, reference_kernels):
    """The reference GEMM (what the other GEMMs are tested against) == x @ w^T + b in float64,
    through the dispatcher as layers call it; its pack_linear prepares nothing."""
    import atom_kernels

    g = torch.Generator().manual_seed(11)
    x, w = torch.randn(2, 5, 24, generator=g), torch.randn(40, 24, generator=g)
    b = torch.randn(40, generator=g) if bias else None
    packed = atom_kernels.pack_linear(w, b)
    assert packed is None
    want = x.double() @ w.double().T + (b.double() if bias else 0)
    torch.testing.assert_close(atom_kernels.linear(x, w, b, packed), want.float())
