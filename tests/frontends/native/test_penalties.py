"""Penalties and min_p against transformers' own logits processors and vLLM's documented formula."""

from __future__ import annotations

import pytest
import torch
from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor

from atom_frontends.native import LLM, SamplingParams
from atom_frontends.native.request import Request
from atom_frontends.native.sampler import _min_p, apply_penalties
from tests.frontends.native.hf_oracle import hf_model, random_prompts

V = 50


def _requests(params: list[SamplingParams], seed: int = 0) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    reqs = []
    for i, sp in enumerate(params):
        prompt, output = torch.randint(0, V, (6 + i,), generator=g), torch.randint(0, V, (9,), generator=g)
        reqs.append(Request(str(i), None, prompt.tolist(), sp, frozenset(), output_token_ids=output.tolist()))
    return reqs


def test_repetition_penalty_matches_transformers():
    reqs = _requests([SamplingParams(repetition_penalty=p) for p in (1.3, 0.7, 1.0)])
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    ours = apply_penalties(logits.clone(), reqs)
    for row, r in enumerate(reqs):
        ids = torch.tensor([r.prompt_token_ids + r.output_token_ids])
        ref = RepetitionPenaltyLogitsProcessor(r.params.repetition_penalty)(ids, logits[row : row + 1].clone())
        torch.testing.assert_close(ours[row], ref[0])
    assert not torch.equal(ours[0], logits[0])


def test_presence_and_frequency_follow_vllms_formula():
    """vLLM (SamplingParams docs): logit - frequency_penalty * count - presence_penalty * (count > 0), with
    count = occurrences of the token among the output tokens (prompt tokens do not count). vLLM itself does
    not install on this CPU-only test machine, so the formula is written out here, element by element."""
    params = [SamplingParams(presence_penalty=0.5, frequency_penalty=0.3),
              SamplingParams(presence_penalty=-1.0, frequency_penalty=1.5), SamplingParams()]
    reqs = _requests(params, seed=2)
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(3))
    ours = apply_penalties(logits.clone(), reqs)
    for row, r in enumerate(reqs):
        for t in range(V):
            count = r.output_token_ids.count(t)
            want = logits[row, t].item() - r.params.frequency_penalty * count - r.params.presence_penalty * (count > 0)
            assert abs(ours[row, t].item() - want) < 1e-5


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.3, 1.0])
def test_min_p_matches_transformers(min_p):
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(4)) * 3
    ours = _min_p(logits, torch.full((4,), min_p))
    ref = MinPLogitsWarper(min_p) if min_p > 0 else None
    expected = ref(None, logits.clone()) if ref else logits
    assert torch.equal(ours.isinf(), expected.isinf()) and torch.equal(ours[~ours.isinf()], logits[~ours.isinf()])


def test_greedy_with_repetition_penalty_matches_hf_generate(checkpoint_factory):
    """vLLM applies penalties before the greedy argmax, as transformers' generate does."""
    path = checkpoint_factory("LlamaForCausalLM")
    llm, model = LLM(path, block_size=4, num_kv_blocks=128), hf_model(path)
    prompts = random_prompts([8, 15], seed=61)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.8),
                        use_tqdm=False)
    plain = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    for p, out in zip(prompts, outs):
        ids = torch.tensor([p])
        with torch.inference_mode():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                 repetition_penalty=1.8, pad_token_id=0)[0, len(p) :].tolist()
        assert out.outputs[0].token_ids == ref
    assert [o.outputs[0].token_ids for o in outs] != [o.outputs[0].token_ids for o in plain]  # it did something


def test_penalties_keep_seeded_sampling_batch_independent(checkpoint_factory):
    llm = LLM(checkpoint_factory("LlamaForCausalLM"), block_size=4, num_kv_blocks=128)
    prompts = random_prompts([7, 12], seed=62)
    sp = [SamplingParams(temperature=1.0, seed=4, max_tokens=10, ignore_eos=True, presence_penalty=1.0,
                         frequency_penalty=0.5, min_p=0.1), SamplingParams(temperature=0.0, max_tokens=10)]
    a = llm.generate(prompts, sp, use_tqdm=False)
    b = llm.generate(prompts[:1], sp[:1], use_tqdm=False)
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(presence_penalty=2.5), ValueError, r"presence_penalty must be in \[-2, 2\]"),
    (dict(frequency_penalty=-3), ValueError, r"frequency_penalty must be in \[-2, 2\]"),
    (dict(frequency_penalty="1"), TypeError, "frequency_penalty must be a number"),
    (dict(repetition_penalty=0), ValueError, "repetition_penalty must be > 0"),
    (dict(repetition_penalty=float("inf")), ValueError, "repetition_penalty must be > 0 and finite"),
    (dict(min_p=1.5), ValueError, r"min_p must be in \[0, 1\]"),
    (dict(min_p=None), TypeError, "min_p must be a number"),
    (dict(n=0), ValueError, "n must be an int >= 1"),
    (dict(n=2.0), TypeError, "n must be an int"),
    (dict(stop=["ok", 3]), TypeError, "stop must be a str, a list of str or None"),
    (dict(stop=""), ValueError, "stop must be non-empty strings"),
    (dict(include_stop_str_in_output=1), TypeError, "include_stop_str_in_output must be a bool"),
])
def test_bad_params(kwargs, error, words):
    with pytest.raises(error, match=words):
        SamplingParams(**kwargs)
