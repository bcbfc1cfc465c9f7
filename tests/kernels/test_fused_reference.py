"""The fused Qwen3 prologue reference == the separate reference ops; the model's switch routes through it."""

from __future__ import annotations

import logging

import pytest
import torch

import atom_kernels
from atom_kernels import reference as ref


def _inputs(dtype, cache_dtype, heads, kv_heads, d, tokens, seed):
    g = torch.Generator().manual_seed(seed)
    # q/k/v as strided views into one qkv projection output [T, (heads + 2 kv_heads) * d], as in the model
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=g).to(dtype)
    q = qkv[:, : heads * d].view(tokens, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(tokens, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(tokens, kv_heads, d)
    wq = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype)
    wk = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype)
    max_pos, rot = 64, d
    cos_sin = torch.randn(max_pos, rot, generator=g)
    positions = torch.randint(0, max_pos, (tokens,), generator=g)
    num_blocks, block_size = 5, 4
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens]
    slots[tokens // 2] = -1  # a padding token: its K/V must not land anywhere
    cache = torch.full((num_blocks, block_size, kv_heads, d), float("nan")).to(cache_dtype)
    scales = (torch.tensor(0.6), torch.tensor(1.7)) if cache_dtype == torch.float8_e4m3fn else (None, None)
    return positions, q, k, v, wq, wk, cos_sin, cache, slots, scales


@pytest.mark.parametrize("dtype, cache_dtype", [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float8_e4m3fn)])
@pytest.mark.parametrize("heads, kv_heads, d", [(4, 2, 16), (3, 3, 8)])
def test_fused_reference_is_the_composition(dtype, cache_dtype, heads, kv_heads, d):
    inputs = _inputs(dtype, cache_dtype, heads, kv_heads, d, tokens=7, seed=heads * 10 + d)
    positions, q, k, v, wq, wk, cos_sin, cache, slots, (ks, vs) = inputs
    q_in, k_in, v_in = q.clone(), k.clone(), v.clone()
    kc, vc = cache.clone(), cache.clone()
    out = ref.fused_qk_norm_rope_write_kv(positions, q, k, v, wq, wk, 1e-6, cos_sin, kc, vc, slots, ks, vs)

    eq, ek = ref.rotary(positions, ref.rms_norm(q, wq, 1e-6), ref.rms_norm(k, wk, 1e-6), cos_sin)
    ekc, evc = cache.clone(), cache.clone()
    ref.write_kv_cache(ek, v, ekc, evc, slots, ks, vs)

    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out, eq, rtol=0, atol=0)
    for got, want in ((kc, ekc), (vc, evc)):
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=0, equal_nan=True)
    # inputs untouched; exactly the 6 non-padding slots were written
    assert torch.equal(q, q_in) and torch.equal(k, k_in) and torch.equal(v, v_in)
    written = ~torch.isnan(kc.float()).flatten(0, 1).any(-1).any(-1)
    assert written.sum() == 6 and written[slots[slots >= 0]].all()


def greedy(checkpoint, monkeypatch, fused: bool, **llm_args) -> tuple[list[list[int]], dict[str, int]]:
    """Greedy tokens of the native engine with the switch on/off, and how often each cache-writing op ran."""
    from atom_frontends.native import LLM, SamplingParams

    calls = {"fused_qk_norm_rope_write_kv": 0, "write_kv_cache": 0}
    with monkeypatch.context() as mp:
        for name in calls:  # count the calls, delegating to the real ops
            real = getattr(atom_kernels, name)

            def spy(*args, _real=real, _name=name, **kwargs):
                calls[_name] += 1
                return _real(*args, **kwargs)

            mp.setattr(atom_kernels, name, spy)
        llm = LLM(checkpoint, **{"block_size": 4, "enforce_eager": True, "num_kv_blocks": 256,
                                 "fused_qk_norm_rope": fused, **llm_args})
        prompts = [[5, 9, 33, 7, 81, 12, 4, 66, 90, 3, 17], [8, 8, 21], [42]]
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], calls


def test_qwen3_switch_routes_through_the_fused_op(checkpoint_factory, monkeypatch):
    path = checkpoint_factory("Qwen3ForCausalLM")
    plain, plain_calls = greedy(path, monkeypatch, fused=False)
    fused, fused_calls = greedy(path, monkeypatch, fused=True)
    assert plain_calls["fused_qk_norm_rope_write_kv"] == 0 and plain_calls["write_kv_cache"] > 0
    # switched on: every cache write goes through the fused op, none through the attention layer
    assert fused_calls["fused_qk_norm_rope_write_kv"] == plain_calls["write_kv_cache"]
    assert fused_calls["write_kv_cache"] == 0
    assert fused == plain


def test_switch_is_ignored_with_one_log_line_by_layers_that_cannot_take_the_write(caplog, monkeypatch):
    """A host attention layer without `fuses_qk_norm_rope` (SGLang's today) keeps the
    unfused path; asked for explicitly (fused_qk_norm_rope=True), the log says so once per layer class, by
    default (None: where supported) nothing is said; the native layer takes the fused write; False turns it off."""
    from atom_core.layers.attention import AttentionSpec
    from atom_core.models.llama import _fused_qk_norm_rope, _warn_fused_unsupported
    from atom_frontends.native.attention import NativeAttention

    class LayerWithoutTheOffer(torch.nn.Module):
        pass

    _warn_fused_unsupported.cache_clear()
    with caplog.at_level(logging.WARNING, logger="atom_core.models.llama"):
        assert not _fused_qk_norm_rope(None, LayerWithoutTheOffer())  # the default: nothing said
        assert not _fused_qk_norm_rope(True, LayerWithoutTheOffer())
        assert not _fused_qk_norm_rope(True, LayerWithoutTheOffer())
    said = [r.getMessage() for r in caplog.records if "ATOM_FUSED_QK_NORM_ROPE" in r.getMessage()]
    assert len(said) == 1 and "LayerWithoutTheOffer" in said[0]
    native = NativeAttention(AttentionSpec(4, 16, 0.25, 2, "model.layers.0.self_attn.attn"))
    assert _fused_qk_norm_rope(None, native) and _fused_qk_norm_rope(True, native)
    assert not _fused_qk_norm_rope(False, native)
