"""Greedy tokens of the native engine == HF transformers `generate` on the same saved checkpoint."""

from __future__ import annotations

import pytest

from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import hf_greedy, random_prompts

LENGTHS = [3, 17, 40, 64, 9]
NEW_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32, "rope_theta": 500000.0}

CASES = {
    "qwen3-gqa-tied": ("Qwen3ForCausalLM", {}),
    "qwen3-untied-mha": ("Qwen3ForCausalLM", dict(tie_word_embeddings=False, num_key_value_heads=4)),
    "llama-gqa-untied": ("LlamaForCausalLM", {}),
    "llama-tied-llama3-rope": ("LlamaForCausalLM", dict(tie_word_embeddings=True, rope_parameters=LLAMA3)),
    "llama-linear-rope": ("LlamaForCausalLM", dict(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                    "rope_theta": 10000.0})),
    "llama-yarn-rope": ("LlamaForCausalLM", dict(rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0})),
    "llama-dynamic-rope": ("LlamaForCausalLM", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                     "rope_theta": 10000.0})),
    "llama-bias-mq": ("LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True, num_key_value_heads=1)),
}


def _expected(path, prompts):
    return hf_greedy(path, prompts, NEW_TOKENS)


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_matches_transformers(checkpoint_factory, case):
    arch, overrides = CASES[case]
    path = checkpoint_factory(arch, **overrides)
    prompts = random_prompts(LENGTHS)
    outs = LLM(path, block_size=8).generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == _expected(path, prompts)
    assert [o.prompt_token_ids for o in outs] == prompts
    for o in outs:
        assert o.finish_reason == ("stop" if len(o.token_ids) < NEW_TOKENS else "length")


def test_prefix_cache_hits_keep_tokens(checkpoint_factory):
    path = checkpoint_factory("Qwen3ForCausalLM")
    base = random_prompts([40], seed=1)[0]
    followups = [base + tail for tail in random_prompts([5, 12, 1], seed=2)]
    llm = LLM(path, block_size=4)
    first = llm.generate([base], GREEDY, use_tqdm=False)
    second = llm.generate(followups, GREEDY, use_tqdm=False)
    assert all(o.num_cached_tokens >= 36 for o in second), [o.num_cached_tokens for o in second]
    assert [o.token_ids for o in first + second] == _expected(path, [base] + followups)
    # The same prompt again: everything but its last block-aligned token comes from the cache.
    again = llm.generate([base], GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens == 36 and again.token_ids == first[0].token_ids


def test_chunked_prefill_keeps_tokens(checkpoint_factory):
    path = checkpoint_factory("LlamaForCausalLM")
    prompts = random_prompts([64, 33, 7, 50], seed=3)
    outs = LLM(path, block_size=4, max_num_batched_tokens=10).generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == _expected(path, prompts)


def test_preemption_keeps_tokens(checkpoint_factory):
    path = checkpoint_factory("Qwen3ForCausalLM")
    prompts = random_prompts([60, 45, 30, 52, 20], seed=4)
    llm = LLM(path, block_size=4, num_kv_blocks=40, max_model_len=128, enable_prefix_caching=False)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == _expected(path, prompts)


def test_preemption_with_prefix_cache_keeps_tokens(checkpoint_factory):
    path = checkpoint_factory("Qwen3ForCausalLM")
    shared = random_prompts([24], seed=5)[0]
    prompts = [shared + t for t in random_prompts([30, 21, 36, 10], seed=6)]
    llm = LLM(path, block_size=4, num_kv_blocks=36, max_model_len=128, max_num_batched_tokens=16)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == _expected(path, prompts)


def test_text_prompts_match_transformers(checkpoint_factory):
    from transformers import AutoTokenizer

    path = checkpoint_factory("Qwen3ForCausalLM")
    texts = ["Hello, world", "The quick brown fox jumps over the lazy dog. " * 2, "é"]
    tok = AutoTokenizer.from_pretrained(str(path))
    ids = [tok(t).input_ids for t in texts]
    outs = LLM(path).generate(texts, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == ids
    assert [o.token_ids for o in outs] == _expected(path, ids)
    assert [o.text for o in outs] == [tok.decode(o.token_ids, skip_special_tokens=True) for o in outs]
