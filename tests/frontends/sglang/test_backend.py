"""atom-core's SGLang attention backend against SGLang's own torch_native backend (the oracle).

Both run on real SGLang pools and ForwardBatches in identical states: same outputs, same KV writes,
for EXTEND over cached prefixes, DECODE, MIXED, IDLE, with sliding windows and GQA, for SGLang's own
RadixAttention layers and for atom-core's layer class alike, on float32 and bfloat16 pools; and over SGLang's
MLA token pool (the absorbed form: one latent "head" of r + rope, values its first r features). On helpers.DEVICE:
on a GPU machine our Triton kernels against torch_native on SGLang's CUDA pools (CPU pools there take SGLang's CUDA
KV-write path and fail in SGLang).
"""

from __future__ import annotations

import pytest
import torch

from tests.frontends.sglang.batches import Requests, idle_batch, make_runner, sglang_runtime
from tests.frontends.sglang.helpers import DEVICE

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 4, 2, 16, 2
LENGTHS = [7, 30, 1, 12]  # whole sequences of the four requests
# (start, end) of each request's tokens in the batch: start > 0 is a cached prefix
SPANS = {
    "extend": [(0, 7), (18, 30), (0, 1), (4, 12)],
    "decode": [(6, 7), (29, 30), (0, 1), (11, 12)],
    "mixed": [(6, 7), (0, 30), (0, 1), (5, 12)],
}


def _layer(kind: str, window: int | None):
    if kind == "sglang":
        from sglang.srt.layers.radix_attention import RadixAttention

        return RadixAttention(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS, layer_id=1,
                              sliding_window_size=window - 1 if window else -1)
    from atom_core.layers.attention import AttentionSpec
    from atom_frontends.sglang.attention import SGLangAttention

    spec = AttentionSpec(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS, "model.layers.1.self_attn.attn",
                         sliding_window=window)
    return SGLangAttention(spec)


def _two_runners(dtype=torch.float32, **pool):
    """Our runner and the oracle's: identical pools holding random K/V for every slot already."""
    pool = pool or dict(kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    ours = make_runner(LAYERS, dtype=dtype, device=DEVICE, **pool)
    theirs = make_runner(LAYERS, dtype=dtype, device=DEVICE, **pool)
    torch.manual_seed(0)
    for buf in _buffers(ours):
        buf.normal_()
    reqs = Requests(ours)
    for n in LENGTHS:
        reqs.add(torch.randint(3, 300, (n,)).tolist())
    for a, b in zip(_buffers(ours), _buffers(theirs)):
        b.copy_(a)
    theirs.req_to_token_pool.req_to_token.copy_(ours.req_to_token_pool.req_to_token)
    return ours, theirs, reqs


def _buffers(runner) -> list[torch.Tensor]:
    pool = runner.token_to_kv_pool
    if hasattr(pool, "kv_buffer"):  # MLA pool: one latent buffer per layer
        return list(pool.kv_buffer)
    return [*pool.k_buffer, *pool.v_buffer]


def _run(backend, layer, fb, q, k, v, save_kv_cache=True):
    backend.init_forward_metadata(fb)
    return backend.forward(q.clone(), k.clone(), v.clone(), layer, fb, save_kv_cache=save_kv_cache)


@pytest.mark.parametrize("layer_kind", ["sglang", "atom"])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("mode", list(SPANS))
@pytest.mark.parametrize("save_kv_cache", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_native(mode, window, layer_kind, save_kv_cache, dtype):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from atom_frontends.sglang.backend import create_backend

    ours, theirs, reqs = _two_runners(dtype)
    fb = reqs.batch(dict(zip(reqs.tokens, SPANS[mode])), mode=mode.upper())
    t = fb.input_ids.shape[0]
    q = torch.randn(t, HEADS * HEAD_DIM, dtype=dtype, device=DEVICE)
    k = torch.randn(t, KV_HEADS, HEAD_DIM, dtype=dtype, device=DEVICE)
    v = torch.randn(t, KV_HEADS, HEAD_DIM, dtype=dtype, device=DEVICE)
    layer = _layer(layer_kind, window)
    got = _run(create_backend(ours), layer, fb, q, k, v, save_kv_cache)
    want = _run(TorchNativeAttnBackend(theirs), layer, fb, q, k, v, save_kv_cache)
    assert got.shape == want.shape == (t, HEADS * HEAD_DIM)
    # bf16: we attend in float32 and round once; SGLang's SDPA runs in bf16 (a few bf16 ulps apart)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    for a, b in zip(_buffers(ours), _buffers(theirs)):
        assert torch.equal(a, b)  # written in place exactly where SGLang writes (or nowhere)
    written = ours.token_to_kv_pool.get_key_buffer(1)[fb.out_cache_loc]
    assert torch.equal(written, k) == save_kv_cache


@pytest.mark.parametrize("backend_kind", ["atom", "torch_native"])
@pytest.mark.parametrize("mode", list(SPANS))
def test_fused_qwen3_prologue_on_decode_steps_under_our_backend(mode, backend_kind):
    """SGLangAttention.forward_qk_norm_rope: on a DECODE step under the atom backend, Qwen3's q/k norm + rotary fused
    into our K/V write == transformers' Qwen3 prologue, then SGLang's torch_native attention (outputs and KV writes);
    on every other step, or under another backend, None (the model then runs the unfused prologue)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding, apply_rotary_pos_emb

    from atom_frontends.sglang.backend import create_backend
    from atom_frontends.sglang.bridge import forward_batch_context

    ours, theirs, reqs = _two_runners()
    fb = reqs.batch(dict(zip(reqs.tokens, SPANS[mode])), mode=mode.upper())
    t = fb.input_ids.shape[0]
    q, k, v = (torch.randn(t, h, HEAD_DIM, device=DEVICE) for h in (HEADS, KV_HEADS, KV_HEADS))
    q_weight, k_weight = (1 + 0.5 * torch.randn(HEAD_DIM, device=DEVICE) for _ in range(2))
    # transformers' Qwen3 prologue is the oracle: its rotary's cos/sin [positions, HEAD_DIM] (two equal halves) give
    # the kernels' cos|sin table [max_positions, HEAD_DIM]
    config = Qwen3Config(hidden_size=HEADS * HEAD_DIM, head_dim=HEAD_DIM, num_attention_heads=HEADS,
                         num_key_value_heads=KV_HEADS, max_position_embeddings=64, rms_norm_eps=1e-6)
    cos, sin = (x[0] for x in Qwen3RotaryEmbedding(config).to(DEVICE)(q, torch.arange(64, device=DEVICE)[None]))
    cos_sin = torch.cat([cos[:, : HEAD_DIM // 2], sin[:, : HEAD_DIM // 2]], -1)
    layer = _layer("atom", None)
    backend = create_backend(ours) if backend_kind == "atom" else TorchNativeAttnBackend(ours)
    backend.init_forward_metadata(fb)
    with forward_context(ForwardContext(attn_backend=backend), forward_batch=fb), forward_batch_context(fb):
        got = layer.forward_qk_norm_rope(fb.positions, q, k, v, (q_weight, k_weight, 1e-6, cos_sin))
    if mode != "decode" or backend_kind != "atom":
        assert got is None
        return
    q_norm, k_norm = Qwen3RMSNorm(HEAD_DIM, 1e-6).to(DEVICE), Qwen3RMSNorm(HEAD_DIM, 1e-6).to(DEVICE)
    q_norm.weight.data, k_norm.weight.data = q_weight, k_weight
    with torch.no_grad():
        qn, kn = apply_rotary_pos_emb(q_norm(q), k_norm(k), cos[fb.positions], sin[fb.positions], unsqueeze_dim=1)
    want = _run(TorchNativeAttnBackend(theirs), layer, fb, qn.reshape(t, -1), kn, v)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(_buffers(ours), _buffers(theirs)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)  # this step's K/V, normed and rotated, where SGLang's go


MLA_RANK, MLA_ROPE = 16, 8


def _mla_layer(kind: str):
    if kind == "sglang":  # how SGLang's own DeepSeek builds its absorbed-form layer
        from sglang.srt.layers.radix_attention import RadixAttention

        return RadixAttention(HEADS, MLA_RANK + MLA_ROPE, 0.3, 1, layer_id=1, v_head_dim=MLA_RANK)
    from atom_core.layers.attention import AttentionSpec
    from atom_frontends.sglang.attention import SGLangMLAAttention

    spec = AttentionSpec(HEADS, MLA_RANK + MLA_ROPE, 0.3, 1, "model.layers.1.self_attn.attn",
                         kv_lora_rank=MLA_RANK, qk_rope_head_dim=MLA_ROPE)
    return SGLangMLAAttention(spec)


@pytest.mark.parametrize("layer_kind", ["sglang", "atom"])
@pytest.mark.parametrize("mode", list(SPANS))
@pytest.mark.parametrize("save_kv_cache", [True, False])
def test_mla_pool_matches_torch_native(sglang_checkpoint, mode, layer_kind, save_kv_cache):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from atom_frontends.sglang.backend import create_backend

    ours, theirs, reqs = _two_runners(kv_heads=1, head_dim=MLA_RANK + MLA_ROPE, mla_rope_dim=MLA_ROPE)
    fb = reqs.batch(dict(zip(reqs.tokens, SPANS[mode])), mode=mode.upper())
    t = fb.input_ids.shape[0]
    q = torch.randn(t, HEADS, MLA_RANK + MLA_ROPE, device=DEVICE)
    k = torch.randn(t, 1, MLA_RANK + MLA_ROPE, device=DEVICE)
    layer = _mla_layer(layer_kind)
    got = _run(create_backend(ours), layer, fb, q, k, k[..., :MLA_RANK], save_kv_cache)
    with sglang_runtime(sglang_checkpoint("llama")):  # the MLA pool's own write reads SGLang's parallel config
        want = _run(TorchNativeAttnBackend(theirs), layer, fb, q, k, k[..., :MLA_RANK], save_kv_cache)
    assert got.shape == want.shape == (t, HEADS * MLA_RANK)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(_buffers(ours), _buffers(theirs)):
        assert torch.equal(a, b)  # the latent rows written in place exactly where SGLang writes them
    written = ours.token_to_kv_pool.get_key_buffer(1)[fb.out_cache_loc]
    assert torch.equal(written, k) == save_kv_cache


def test_mla_layer_over_the_mha_pool_is_refused():
    from atom_frontends.sglang.backend import create_backend

    _, _, reqs = _two_runners()
    fb = reqs.batch(dict(zip(reqs.tokens, SPANS["decode"])))
    backend = create_backend(reqs.runner)
    backend.init_forward_metadata(fb)
    t = fb.input_ids.shape[0]
    q = torch.randn(t, HEADS, MLA_RANK + MLA_ROPE, device=DEVICE)
    k = torch.randn(t, 1, MLA_RANK + MLA_ROPE, device=DEVICE)
    with pytest.raises(NotImplementedError, match="latent \\(MLA\\)-attention layer over SGLang's MHA"):
        backend.forward(q, k, k[..., :MLA_RANK], _mla_layer("atom"), fb)


def test_metadata_describes_the_batch():
    from atom_frontends.sglang.metadata import build_metadata

    _, _, reqs = _two_runners()
    fb = reqs.batch(dict(zip(reqs.tokens, SPANS["mixed"])), mode="MIXED")
    md = build_metadata(fb, reqs.runner.req_to_token_pool.req_to_token)
    assert md.query_start_loc.tolist() == [0, 1, 31, 32, 39]
    assert md.seq_lens.tolist() == [7, 30, 1, 12] and md.max_seq_len == 30 and md.max_query_len == 30
    assert (md.num_decodes, md.num_prefills, md.num_tokens - md.num_decodes) == (2, 2, 37)
    assert md.block_tables.shape == (4, 30)
    assert torch.equal(md.slot_mapping, fb.out_cache_loc) and torch.equal(md.positions, fb.positions)


def test_idle_batch_has_no_metadata_and_empty_output():
    from atom_frontends.sglang.backend import create_backend

    runner = make_runner(LAYERS, KV_HEADS, HEAD_DIM)
    backend, fb = create_backend(runner), idle_batch()
    backend.init_forward_metadata(fb)
    assert backend.forward_metadata is None
    empty = torch.zeros(0, HEADS * HEAD_DIM)
    out = backend.forward(empty, empty.view(0, KV_HEADS, HEAD_DIM), empty.view(0, KV_HEADS, HEAD_DIM),
                          _layer("sglang", None), fb)
    assert out.shape == (0, HEADS * HEAD_DIM)


def test_unsupported_layer_features_are_named():
    from sglang.srt.layers.radix_attention import RadixAttention

    from atom_frontends.sglang.backend import spec_of

    capped = RadixAttention(HEADS, HEAD_DIM, 0.25, KV_HEADS, layer_id=0, logit_cap=30.0)
    with pytest.raises(NotImplementedError, match="logit capping"):
        spec_of(capped)
