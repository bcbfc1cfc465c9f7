"""vLLM's output shape (RequestOutput / CompletionOutput), finish and stop reasons, abort, and n > 1."""

from __future__ import annotations

import pytest

from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import hf_greedy, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def setup(checkpoint_factory):
    path = checkpoint_factory("LlamaForCausalLM")
    return LLM(path, block_size=4, num_kv_blocks=128), path


def _drain(engine) -> dict:
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step()})
    return done


def test_output_fields_and_stop_reasons(setup):
    llm, path = setup
    prompt = random_prompts([11], seed=31)[0]
    ref = hf_greedy(path, [prompt], 8)[0]
    out = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert out.finished and out.prompt_token_ids == prompt and out.prompt_logprobs is None
    [c] = out.outputs
    assert (c.index, c.token_ids, c.logprobs, c.cumulative_logprob) == (0, ref, None, None)
    assert (c.finish_reason, c.stop_reason) == ("length", None)
    stop = SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[ref[3]])
    c = llm.generate([prompt], stop, use_tqdm=False)[0].outputs[0]
    first = ref.index(ref[3])
    assert (c.token_ids, c.finish_reason, c.stop_reason) == (ref[: first + 1], "stop", ref[3])


def test_eos_gives_no_stop_reason(checkpoint_factory):
    path = checkpoint_factory("LlamaForCausalLM")
    prompt = random_prompts([9], seed=32)[0]
    ref = hf_greedy(path, [prompt], 6)[0]
    # make the 3rd greedy token the checkpoint's EOS: vLLM reports finish "stop" with stop_reason None
    llm = LLM(path, block_size=4, num_kv_blocks=64)
    llm.engine.eos_token_ids = frozenset({ref[2]})
    c = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0]
    first = ref.index(ref[2])
    assert (c.token_ids, c.finish_reason, c.stop_reason) == (ref[: first + 1], "stop", None)


def test_abort_reports_abort_and_others_go_on(setup):
    llm, path = setup
    engine = llm.engine
    prompts = random_prompts([13, 9, 6], seed=33)
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    engine.step()  # all three running
    free_before = engine.block_manager.num_free_blocks
    seen = engine.current_output(ids[1]).outputs[0].token_ids
    assert engine.abort(ids[1]) and not engine.abort("no-such-request")
    assert engine.block_manager.num_free_blocks > free_before  # its blocks came back
    aborted = engine.step()
    assert [(o.request_id, o.finished, o.outputs[0].finish_reason) for o in aborted] == [(ids[1], True, "abort")]
    # the token of its prefill step; with overlap scheduling still on the device when it was aborted: dropped
    assert aborted[0].outputs[0].token_ids == seen and len(seen) == (0 if engine.overlap else 1)
    done = _drain(engine)
    ref = hf_greedy(path, prompts, 8)
    assert [done[ids[0]].outputs[0].token_ids, done[ids[2]].outputs[0].token_ids] == [ref[0], ref[2]]


def test_abort_of_a_waiting_request(setup):
    llm, _ = setup
    engine = llm.engine
    rid = engine.add_request([5, 6, 7], GREEDY)
    assert engine.abort(rid)
    [out] = engine.step()
    assert out.request_id == rid and out.outputs[0].finish_reason == "abort" and out.outputs[0].token_ids == []
    assert not engine.has_unfinished()


@pytest.mark.parametrize("caching", [True, False])
def test_n_samples_share_the_prompt_blocks(checkpoint_factory, caching):
    path = checkpoint_factory("LlamaForCausalLM")
    llm = LLM(path, block_size=4, num_kv_blocks=64, enable_prefix_caching=caching)
    engine, bm = llm.engine, llm.engine.block_manager
    prompt = random_prompts([21], seed=34)[0]
    rid = engine.add_request(prompt, SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True))
    engine.step()  # sample 0's prefill; samples 1, 2 wait for it
    engine.step()  # samples 1, 2 fork: share the 5 full prompt blocks, compute prompt token 20 themselves
    samples = engine._groups[rid]
    shared = samples[0].block_ids[:5]
    assert all(s.block_ids[:5] == shared for s in samples)
    assert [bm.ref_counts[b] for b in shared] == [3] * 5
    # 6 blocks for sample 0 (21 prompt + 1 token), one own block each for the others (18 without sharing)
    assert bm.num_blocks - bm.num_free_blocks == 8
    out = _drain(engine)[rid]
    assert [c.index for c in out.outputs] == [0, 1, 2] and all(len(c.token_ids) == 6 for c in out.outputs)
    assert bm.num_blocks - bm.num_free_blocks == 0 and not any(bm.ref_counts)


def test_n_seeded_is_reproducible_and_greedy_n_matches_hf(setup):
    llm, path = setup
    prompts = random_prompts([10, 17], seed=35)
    sp = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    a = [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, sp, use_tqdm=False)]
    b = [[c.token_ids for c in o.outputs] for o in llm.generate(prompts[::-1], sp, use_tqdm=False)[::-1]]
    assert a == b
    assert all(len({tuple(t) for t in samples}) == 3 for samples in a)  # seed + i: three different streams
    # sample i of n with seed s draws what a single sample with seed s + i draws
    single = llm.generate(prompts, SamplingParams(temperature=1.0, seed=9, max_tokens=10, ignore_eos=True),
                          use_tqdm=False)
    assert [o.outputs[0].token_ids for o in single] == [samples[2] for samples in a]
    greedy = llm.generate(prompts, SamplingParams(n=2, temperature=0.0, max_tokens=8), use_tqdm=False)
    ref = hf_greedy(path, prompts, 8)
    assert [[c.token_ids for c in o.outputs] for o in greedy] == [[r, r] for r in ref]


def test_n_when_sample_0_finishes_in_its_prefill(setup):
    """max_tokens=1: sample 0 is done (its blocks freed) before the others start; they compute the prompt
    themselves (or from the prefix cache) and still match transformers."""
    llm, path = setup
    prompt = random_prompts([18], seed=36)[0]
    out = llm.generate([prompt], SamplingParams(n=3, temperature=0.0, max_tokens=1), use_tqdm=False)[0]
    assert [c.token_ids for c in out.outputs] == [hf_greedy(path, [prompt], 1)[0]] * 3
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_text_is_left_out(setup, include):
    """vLLM: the text of the stop token that ended a sample is not in `text` (its id is in token_ids),
    unless include_stop_str_in_output."""
    llm, path = setup
    prompt = random_prompts([11], seed=37)[0]
    ref = hf_greedy(path, [prompt], 8)[0]
    first = ref.index(ref[4])
    sp = SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[ref[4]], include_stop_str_in_output=include)
    c = llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0]
    kept = ref[: first + 1] if include else ref[:first]
    assert c.token_ids == ref[: first + 1] and c.text == llm.tokenizer.decode(kept, skip_special_tokens=True)


def test_request_ids(setup):
    llm, _ = setup
    engine = llm.engine
    engine.add_request([5, 6, 7], GREEDY, request_id="0")
    with pytest.raises(ValueError, match="request_id '0' is already in use"):
        engine.add_request([5, 6, 7], GREEDY, request_id="0")
    auto = [engine.add_request([5, 6, 7], GREEDY) for _ in range(3)]  # the counter skips the live "0"
    assert "0" not in auto and len(set(auto)) == 3
    assert set(_drain(engine)) == {"0", *auto}
