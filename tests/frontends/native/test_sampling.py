"""Sampling controls of the native engine."""

from __future__ import annotations

import pytest
import torch

from atom_frontends.native import LLM, SamplingParams
from atom_frontends.native.sampler import _top_k_top_p
from tests.frontends.native.hf_oracle import hf_greedy, random_prompts


@pytest.fixture(scope="module")
def setup(checkpoint_factory):
    path = checkpoint_factory("LlamaForCausalLM")
    return LLM(path, block_size=4), path


def test_seeded_sampling_is_reproducible_and_batch_independent(setup):
    llm, _ = setup
    prompts = random_prompts([7, 12, 30], seed=21)
    params = [SamplingParams(temperature=1.0, max_tokens=16, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    a = llm.generate(prompts, params, use_tqdm=False)
    b = llm.generate(prompts[::-1], params[::-1], use_tqdm=False)[::-1]
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    c = llm.generate(prompts[:1], SamplingParams(temperature=1.0, max_tokens=16, seed=99, ignore_eos=True),
                     use_tqdm=False)
    assert c[0].outputs[0].token_ids != a[0].outputs[0].token_ids  # different seed, (practically always) different draw


def test_top_k_1_and_tiny_top_p_are_greedy(setup):
    llm, path = setup
    prompts = random_prompts([9, 25], seed=22)
    ref = hf_greedy(path, prompts, 12)
    for params in (SamplingParams(temperature=0.8, top_k=1, max_tokens=12),
                   SamplingParams(temperature=0.8, top_p=1e-6, max_tokens=12)):
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == ref


def test_top_k_top_p_filter_matches_definition():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0]])
    out = _top_k_top_p(logits, torch.tensor([2, 4]), torch.tensor([1.0, 0.9]))
    # row 0: top-2 keeps logits 3 and 2; row 1: p(5)≈0.97 ≥ 0.9 so only index 2 survives
    assert torch.isfinite(out).tolist() == [[True, False, True, False], [False, False, True, False]]


def test_stop_token_ids_and_min_tokens(setup):
    llm, path = setup
    prompt = random_prompts([15], seed=23)[0]
    ref = hf_greedy(path, [prompt], 12)[0]
    stop = ref[3]
    first = ref.index(stop)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop]),
                       use_tqdm=False)[0]
    assert out.outputs[0].token_ids == ref[: first + 1] and out.outputs[0].finish_reason == "stop"
    # min_tokens masks the stop token until enough tokens exist
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, min_tokens=12,
                                                stop_token_ids=[stop]), use_tqdm=False)[0]
    c = out.outputs[0]
    assert len(c.token_ids) == 12 and stop not in c.token_ids and c.finish_reason == "length"


def test_eos_stops_unless_ignored(setup):
    llm, path = setup
    prompt = random_prompts([15], seed=23)[0]
    ref = hf_greedy(path, [prompt], 6)[0]
    # make the 3rd greedy token the EOS: the engine must stop right there
    llm.engine.eos_token_ids = frozenset({ref[2]})
    try:
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0]
        assert out.outputs[0].token_ids == ref[: ref.index(ref[2]) + 1] and out.outputs[0].finish_reason == "stop"
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                           use_tqdm=False)[0]
        assert out.outputs[0].token_ids == ref and out.outputs[0].finish_reason == "length"
    finally:
        llm.engine.eos_token_ids = frozenset({2})


def test_max_model_len_caps_generation(checkpoint_factory):
    llm = LLM(checkpoint_factory("LlamaForCausalLM"), max_model_len=20)
    out = llm.generate([list(range(3, 18))], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 5 and out.outputs[0].finish_reason == "length"
