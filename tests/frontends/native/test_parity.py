"""Greedy tokens of the native engine == HF transformers `generate` on the same saved checkpoint.

Each scenario runs the engine, asserts that the path it is about really ran (cache hits, preemptions, chunks,
the unfused prologue) and returns (our tokens, transformers' tokens). The tests here want them equal;
test_canary.py runs the same scenarios with one op broken on purpose and wants them to differ. The oracle
(hf_greedy) refuses a reference whose tokens do not vary with the context.
"""

from __future__ import annotations

import pytest

from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import hf_greedy, random_prompts

LENGTHS = [3, 17, 40, 64, 9]
NEW_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32, "rope_theta": 500000.0}

# name → (architecture, checkpoint overrides); build_checkpoint's init (0.2) makes every reference vary
CASES = {
    "qwen3-gqa-tied": ("Qwen3ForCausalLM", {}),
    "qwen3-untied-mha": ("Qwen3ForCausalLM", dict(tie_word_embeddings=False, num_key_value_heads=4)),
    "llama-gqa-untied": ("LlamaForCausalLM", {}),
    # seed 1: with seed 0 one continuation settles on a repeated token (the oracle refuses it)
    "llama-tied-llama3-rope": ("LlamaForCausalLM", dict(tie_word_embeddings=True, rope_parameters=LLAMA3, seed=1)),
    "llama-linear-rope": ("LlamaForCausalLM", dict(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                    "rope_theta": 10000.0})),
    "llama-yarn-rope": ("LlamaForCausalLM", dict(rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0})),
    "llama-bias-mq": ("LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True, num_key_value_heads=1)),
}

Outcome = tuple[list[list[int]], list[list[int]]]  # (ours, transformers')
Checkpoint = tuple[str, dict]  # (architecture, checkpoint overrides), as CASES' values; MoE tests pass theirs


def _generate(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def plain(checkpoint_factory, checkpoint: Checkpoint = CASES["qwen3-gqa-tied"]) -> Outcome:
    """Five prompts of different lengths in one batch."""
    arch, overrides = checkpoint
    path = checkpoint_factory(arch, **overrides)
    prompts = random_prompts(LENGTHS)
    outs = LLM(path, block_size=8).generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == prompts
    for o in outs:
        assert o.outputs[0].finish_reason == ("stop" if len(o.outputs[0].token_ids) < NEW_TOKENS else "length")
    return [o.outputs[0].token_ids for o in outs], hf_greedy(path, prompts, NEW_TOKENS)


def prefix_cache(checkpoint_factory, checkpoint: Checkpoint = CASES["qwen3-gqa-tied"]) -> Outcome:
    """Follow-ups of a 40-token prompt reuse its cached blocks; the same prompt again reuses all but one token."""
    path = checkpoint_factory(checkpoint[0], **checkpoint[1])
    base = random_prompts([40], seed=1)[0]
    followups = [base + tail for tail in random_prompts([5, 12, 1], seed=2)]
    llm = LLM(path, block_size=4)
    first = llm.generate([base], GREEDY, use_tqdm=False)
    second = llm.generate(followups, GREEDY, use_tqdm=False)
    assert all(o.num_cached_tokens >= 36 for o in second), [o.num_cached_tokens for o in second]
    again = llm.generate([base], GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens == 36
    got = [o.outputs[0].token_ids for o in first + second + [again]]
    return got, hf_greedy(path, [base] + followups + [base], NEW_TOKENS)


def chunked_prefill(checkpoint_factory, checkpoint: Checkpoint = CASES["llama-gqa-untied"]) -> Outcome:
    """A 10-token step budget: prompts are prefilled in chunks, next to other requests' decodes."""
    path = checkpoint_factory(checkpoint[0], **checkpoint[1])
    prompts = random_prompts([64, 33, 7, 50], seed=3)
    llm = LLM(path, block_size=4, max_num_batched_tokens=10)
    return _generate(llm, prompts), hf_greedy(path, prompts, NEW_TOKENS)


def preemption(checkpoint_factory, checkpoint: Checkpoint = CASES["qwen3-gqa-tied"]) -> Outcome:
    """A KV cache too small for every request at once: the newest are preempted and recomputed."""
    path = checkpoint_factory(checkpoint[0], **checkpoint[1])
    prompts = random_prompts([60, 45, 30, 52, 20], seed=4)
    llm = LLM(path, block_size=4, num_kv_blocks=40, max_model_len=128, enable_prefix_caching=False)
    got = _generate(llm, prompts)
    assert llm.engine.scheduler.num_preemptions > 0
    return got, hf_greedy(path, prompts, NEW_TOKENS)


def preemption_with_prefix_cache(checkpoint_factory, checkpoint: Checkpoint = CASES["qwen3-gqa-tied"]) -> Outcome:
    path = checkpoint_factory(checkpoint[0], **checkpoint[1])
    shared = random_prompts([24], seed=5)[0]
    prompts = [shared + t for t in random_prompts([30, 21, 36, 10], seed=6)]
    llm = LLM(path, block_size=4, num_kv_blocks=36, max_model_len=128, max_num_batched_tokens=16)
    got = _generate(llm, prompts)
    assert llm.engine.scheduler.num_preemptions > 0
    return got, hf_greedy(path, prompts, NEW_TOKENS)


def unfused_prologue(checkpoint_factory,
                     checkpoint: Checkpoint = ("Qwen3ForCausalLM", dict(tie_word_embeddings=False))) -> Outcome:
    """Qwen3's q/k norm, rotary and KV write as separate ops (fused_qk_norm_rope=False; the other scenarios
    run the fused op, the default), with prompts chunked so later chunks read what earlier ones wrote."""
    path = checkpoint_factory(checkpoint[0], **checkpoint[1])
    prompts = random_prompts(LENGTHS, seed=8)
    llm = LLM(path, block_size=4, max_num_batched_tokens=24, fused_qk_norm_rope=False)
    assert not any(layer.self_attn.fused_qk_norm_rope for layer in llm.engine.model.model.layers)
    return _generate(llm, prompts), hf_greedy(path, prompts, NEW_TOKENS)


def text_prompts(checkpoint_factory) -> Outcome:
    """Strings through the checkpoint's tokenizer: our ids, tokens and text == transformers'."""
    from transformers import AutoTokenizer

    path = checkpoint_factory("Qwen3ForCausalLM")
    texts = ["Hello, world", "The quick brown fox jumps over the lazy dog. " * 2, "é"]
    tok = AutoTokenizer.from_pretrained(str(path))
    ids = [tok(t).input_ids for t in texts]
    outs = LLM(path).generate(texts, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == ids
    assert [o.outputs[0].text for o in outs] == [tok.decode(o.outputs[0].token_ids, skip_special_tokens=True)
                                                 for o in outs]
    return [o.outputs[0].token_ids for o in outs], hf_greedy(path, ids, NEW_TOKENS)


# Scenarios the canary breaks ops under (test_canary.py); each also has its parity test below.
SCENARIOS = {f.__name__: f for f in (plain, prefix_cache, chunked_prefill, preemption, unfused_prologue)}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_matches_transformers(checkpoint_factory, case):
    ours, want = plain(checkpoint_factory, CASES[case])
    assert ours == want


@pytest.mark.parametrize("scenario", [prefix_cache, chunked_prefill, preemption, preemption_with_prefix_cache,
                                      unfused_prologue, text_prompts], ids=lambda f: f.__name__)
def test_scenario_matches_transformers(checkpoint_factory, scenario):
    ours, want = scenario(checkpoint_factory)
    assert ours == want
