"""fp8 KV cache (kv_cache_dtype="fp8": e4m3, scale 1.0) in the native engine == transformers with its K/V rounded
to e4m3 the same way.

What fp8 KV changes, stated as a parity: the engine stores every key and value rounded to float8 e4m3 and
attends over those, so its outputs equal transformers' on the same checkpoint only when transformers' attention
reads K/V rounded alike. The oracle is transformers' own eager attention (and eager causal mask), registered under
another name with its key/value states rounded to e4m3 and back (round to nearest even, as torch casts) before it
runs; everything else is transformers' model. fp32 weights: the greedy tokens must then be equal. Against plain
transformers the fp8 engine diverges where a step's top-2 logits are closer than the rounding moves them (on this
checkpoint the first token's logprob moves by 0.007-0.045; test_fp8_cache_is_used).
"""

from __future__ import annotations

import pytest
import torch

from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import hf_model, informative_greedy, random_prompts

FP8 = torch.float8_e4m3fn
LENGTHS = [3, 17, 40, 64, 9]
NEW_TOKENS = 24
ATTN = "eager_fp8_kv"


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(FP8).to(x.dtype)


def _fp8_kv_eager(module, query, key, value, attention_mask, **kwargs):
    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    return eager_attention_forward(module, query, _e4m3(key), _e4m3(value),
                                   attention_mask, **kwargs)


@pytest.fixture(scope="module")
def fp8_oracle():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(ATTN, _fp8_kv_eager)
    # and eager's causal mask: an unknown name would get sdpa's, which is None where is_causal would do
    AttentionMaskInterface.register(ATTN, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    return ATTN


def _ours(path, prompts, kv_cache_dtype: str, **kw):
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=0, ignore_eos=True)
    outs = LLM(path, block_size=8, kv_cache_dtype=kv_cache_dtype, **kw).generate(prompts, params, use_tqdm=False)
    return ([o.outputs[0].token_ids for o in outs],
            [[next(iter(lp.values())).logprob for lp in o.outputs[0].logprobs] for o in outs])


@pytest.mark.parametrize("chunked", [False, True], ids=["whole-prompts", "chunked-prefill"])
def test_fp8_kv_greedy_matches_transformers_with_fp8_rounded_kv(checkpoint_factory, fp8_oracle, chunked):
    path = checkpoint_factory("Qwen3ForCausalLM")
    prompts = random_prompts(LENGTHS)
    model = hf_model(path)
    model.config._attn_implementation = fp8_oracle
    want = informative_greedy(model, prompts, NEW_TOKENS, f"{path} (fp8-rounded K/V)")
    kw = dict(max_num_batched_tokens=16) if chunked else {}  # 16-token chunks: later chunks read fp8 prefixes
    got, _ = _ours(path, prompts, "fp8", **kw)
    assert got == want


def rounded_like_our_latent_cache(model, monkeypatch):
    """transformers' DeepSeek-V3 `model`, rounding to e4m3 what our MLA cache stores, the latent row per token:
    the compressed KV after kv_a_layernorm (forward hooks) and the roped k_pe (the module's rope functions
    wrapped, through monkeypatch). Every MLA attention of ours, prefill included, reads the cache."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    for name in ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave"):
        def rounded_k(q, k, *args, _rope=getattr(m, name), **kwargs):
            q, k = _rope(q, k, *args, **kwargs)
            return q, _e4m3(k)

        monkeypatch.setattr(m, name, rounded_k)
    for layer in model.model.layers:
        layer.self_attn.kv_a_layernorm.register_forward_hook(lambda mod, args, out: _e4m3(out))
    return model


@pytest.mark.parametrize("chunked", [False, True], ids=["whole-prompts", "chunked-prefill"])
def test_fp8_latent_greedy_matches_transformers_with_fp8_rounded_latent(checkpoint_factory, monkeypatch, chunked):
    path = checkpoint_factory("DeepseekV3ForCausalLM")
    prompts = random_prompts(LENGTHS)
    model = rounded_like_our_latent_cache(hf_model(path), monkeypatch)
    want = informative_greedy(model, prompts, NEW_TOKENS, f"{path} (fp8-rounded latent)")
    kw = dict(max_num_batched_tokens=16) if chunked else {}
    got, _ = _ours(path, prompts, "fp8", **kw)
    assert got == want


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "DeepseekV3ForCausalLM"])
def test_fp8_cache_is_used(checkpoint_factory, arch):
    """The fp8 engine's first-token logprobs differ from the fp32-cache engine's on the same prompts, so
    the parities above are about a cache that really rounds."""
    path = checkpoint_factory(arch)
    prompts = random_prompts(LENGTHS)
    (_, exact), (_, fp8) = _ours(path, prompts, "auto"), _ours(path, prompts, "fp8")
    moved = [abs(a[0] - b[0]) for a, b in zip(exact, fp8)]
    assert max(moved) > 1e-4, f"fp8 KV left the first logprobs unchanged ({moved}): is the fp8 cache used?"
