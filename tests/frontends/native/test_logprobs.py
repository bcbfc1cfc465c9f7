"""logprobs / prompt_logprobs (vLLM's raw mode) against transformers' log_softmax of its own logits."""

from __future__ import annotations

import pytest
import torch

from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import hf_model, random_prompts

TOL = 1e-4
TOP = 3


@pytest.fixture(scope="module")
def setup(checkpoint_factory):
    path = checkpoint_factory("LlamaForCausalLM")
    # a budget of 8 tokens a step: the prompts below are prefilled in chunks
    llm = LLM(path, block_size=4, num_kv_blocks=256, max_num_batched_tokens=8)
    return llm, hf_model(path)


@torch.inference_mode()
def _hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), V] float32: row p = log_softmax of transformers' logits after ids[: p + 1]."""
    return model(torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)


def _check(entry: dict, ref: torch.Tensor, chosen: int, n: int, tok) -> None:
    """entry: our {token id: Logprob} for one position; ref [V]: transformers' logprobs there."""
    top = ref.topk(n).indices.tolist()
    assert set(entry) == {chosen, *top}
    for t, lp in entry.items():
        assert abs(lp.logprob - ref[t].item()) < TOL
        assert lp.rank == int((ref >= ref[t]).sum())  # vLLM's rank: the tokens at least as likely
        assert lp.decoded_token == tok.decode([t])
    assert [entry[t].rank for t in top] == list(range(1, n + 1))


def test_sample_logprobs_match_hf(setup):
    llm, model = setup
    prompts = random_prompts([13, 6], seed=51)
    # temperature and top_k do not change the logprobs: vLLM reports those of the raw logits
    sp = SamplingParams(temperature=0.7, top_k=20, seed=3, max_tokens=10, ignore_eos=True, logprobs=TOP)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    ranks = []
    for prompt, out in zip(prompts, outs):
        c = out.outputs[0]
        ref = _hf_logprobs(model, prompt + c.token_ids)[len(prompt) - 1 : -1]
        assert len(c.logprobs) == len(c.token_ids) == 10
        for i, (tok_id, entry) in enumerate(zip(c.token_ids, c.logprobs)):
            _check(entry, ref[i], tok_id, TOP, llm.tokenizer)
            ranks.append(entry[tok_id].rank)
        expected = sum(ref[i, t].item() for i, t in enumerate(c.token_ids))
        assert abs(c.cumulative_logprob - expected) < 10 * TOL
    assert max(ranks) > 1  # sampling, not greedy: some chosen tokens are not the most likely


def test_logprobs_zero_gives_only_the_chosen_token(setup):
    llm, model = setup
    prompt = random_prompts([9], seed=52)[0]
    c = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4, logprobs=0),
                     use_tqdm=False)[0].outputs[0]
    ref = _hf_logprobs(model, prompt + c.token_ids)[len(prompt) - 1 : -1]
    for i, (t, entry) in enumerate(zip(c.token_ids, c.logprobs)):
        assert list(entry) == [t] and entry[t].rank == 1 and abs(entry[t].logprob - ref[i, t].item()) < TOL


def test_prompt_logprobs_chunked_and_not_from_the_prefix_cache(setup):
    llm, model = setup
    other, prompt = random_prompts([10, 30], seed=53)
    sp = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=TOP)
    for _ in range(2):  # the second time the prompt's blocks are cached: they must not be skipped
        # `other` (no prompt logprobs) shares the steps, so the prompt's rows sit after other's in the batch
        plain, out = llm.generate([other, prompt], [SamplingParams(temperature=0.0, max_tokens=2), sp],
                                  use_tqdm=False)
        assert plain.prompt_logprobs is None and out.num_cached_tokens == 0
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        ref = _hf_logprobs(model, prompt)
        for p in range(1, len(prompt)):
            _check(out.prompt_logprobs[p], ref[p - 1], prompt[p], TOP, llm.tokenizer)
    assert llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)[0].num_cached_tokens > 0


@pytest.mark.parametrize("field, value, error", [
    ("logprobs", -1, ValueError), ("prompt_logprobs", 1.5, TypeError), ("logprobs", True, TypeError),
])
def test_bad_logprobs(field, value, error):
    with pytest.raises(error, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})


def test_prompt_logprobs_survive_preemption(checkpoint_factory):
    """A request preempted after its prefill recomputes its prompt: its prompt logprobs are not repeated."""
    path = checkpoint_factory("LlamaForCausalLM")
    llm = LLM(path, block_size=4, num_kv_blocks=16, max_model_len=64, max_num_batched_tokens=8)
    first, prompt = random_prompts([20, 30], seed=54)
    outs = llm.generate([first, prompt], [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
                                          SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True,
                                                         prompt_logprobs=TOP)], use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    out, ref = outs[1], _hf_logprobs(hf_model(path), prompt)
    assert len(out.prompt_logprobs) == len(prompt)
    for p in range(1, len(prompt)):
        _check(out.prompt_logprobs[p], ref[p - 1], prompt[p], TOP, llm.tokenizer)
