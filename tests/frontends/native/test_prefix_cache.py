"""Prefix caching registers every full, computed block, including those a request fills in its last step."""

from __future__ import annotations

from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import hf_greedy, random_prompts

ONE = SamplingParams(temperature=0.0, max_tokens=1)


def test_prompt_sent_again_with_one_new_token_hits_the_cache(checkpoint_factory):
    path = checkpoint_factory("Qwen3ForCausalLM")
    prompt = random_prompts([40], seed=31)[0]
    llm = LLM(path, block_size=4)
    outs = [llm.generate([prompt], ONE, use_tqdm=False)[0] for _ in range(3)]
    # every full block but the one holding the last prompt token (it must be computed to sample)
    assert [o.num_cached_tokens for o in outs] == [0, 36, 36]
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(path, [prompt] * 3, 1)


def test_request_stopping_at_its_first_token_caches_its_prompt(checkpoint_factory):
    path = checkpoint_factory("Qwen3ForCausalLM")
    prompt = random_prompts([40], seed=32)[0]
    llm = LLM(path, block_size=4)
    first = hf_greedy(path, [prompt], 1)[0][0]
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[first]),
                       use_tqdm=False)[0]
    assert out.outputs[0].token_ids == [first] and out.outputs[0].finish_reason == "stop"
    again = llm.generate([prompt + [first, 7, 8]], ONE, use_tqdm=False)[0]
    assert again.num_cached_tokens == 40


def test_blocks_filled_by_outputs_in_the_last_step_are_cached(checkpoint_factory):
    path = checkpoint_factory("LlamaForCausalLM")
    prompt = random_prompts([37], seed=33)[0]
    llm = LLM(path, block_size=4)
    # 37 prompt + 3 outputs: the last step computes token 39, filling block 9 (tokens 36..39)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)[0]
    follow = prompt + out.outputs[0].token_ids + [5]
    again = llm.generate([follow], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)[0]
    assert again.num_cached_tokens == 40
    assert [out.outputs[0].token_ids, again.outputs[0].token_ids] == [hf_greedy(path, [prompt], 4)[0],
                                                                      hf_greedy(path, [follow], 8)[0]]
