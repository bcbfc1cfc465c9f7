"""Overlap scheduling (EngineArgs.overlap_scheduling): the CPU schedules and launches step n+1 before it reads
step n's tokens. On CPU the same code runs (no real overlap, the same bookkeeping), so these tests exercise it:
results equal transformers' with overlap on and off, requests stop exactly where transformers' tokens say (no
token past a stop: the extra step a request got before its stop was read is dropped), every KV block is free
at the end, and breaking the one-step-late bookkeeping on purpose fails the comparison (the canaries).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from atom_frontends.native import LLM, SamplingParams
from atom_frontends.native import inputs as inputs_module
from atom_frontends.native import sampler as sampler_module
from atom_frontends.native.engine import LLMEngine
from atom_frontends.native.sampler import StepOutput
from tests.frontends.native import test_parity
from tests.frontends.native.hf_oracle import hf_greedy, hf_model, random_prompts

NEW = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW)
# HF's repetition penalty: > 1 pushes seen tokens down, < 1 pulls them up (then the token just sampled, the one
# still on the device with overlap, is likely to come again: a penalty that misses it changes the output)
PENALTIES = (0.4, 1.5)
MODES = pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])


@pytest.fixture
def overlap_env(monkeypatch):
    """Overlap on for every engine built in the test (as ATOM_OVERLAP_SCHEDULING=1 does), checked to be on."""
    monkeypatch.setenv("ATOM_OVERLAP_SCHEDULING", "1")
    seen = []
    launch = LLMEngine._launch

    def spy(self, batch):
        seen.append(self.overlap)
        return launch(self, batch)

    monkeypatch.setattr(LLMEngine, "_launch", spy)
    yield
    assert seen and all(seen), "overlap scheduling did not run"


def assert_all_free(llm: LLM) -> None:
    """Nothing left running, waiting or in flight; every KV block free with no references."""
    engine, bm = llm.engine, llm.engine.block_manager
    assert not engine.has_unfinished()
    assert bm.num_free_blocks == bm.num_blocks and not any(bm.ref_counts)


def truncated(ref: list[int], params: SamplingParams, eos: set[int]) -> tuple[list[int], str]:
    """transformers' greedy tokens cut where our engine must stop: the first stop token (EOS unless ignore_eos,
    stop_token_ids) at or past min_tokens, else max_tokens; with the finish reason."""
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else eos)
    for i, t in enumerate(ref[: params.max_tokens]):
        if t in stops and i + 1 >= params.min_tokens:
            return ref[: i + 1], "stop"
    return ref[: params.max_tokens], "length"


@pytest.mark.parametrize("scenario", [*test_parity.SCENARIOS.values(), test_parity.preemption_with_prefix_cache,
                                      test_parity.text_prompts], ids=lambda f: f.__name__)
def test_parity_scenarios_with_overlap(checkpoint_factory, overlap_env, scenario):
    """test_parity's scenarios (prefix hits, chunked prefill, preemption, the unfused prologue) with overlap on."""
    ours, want = scenario(checkpoint_factory)
    assert ours == want


def test_mixed_steps_take_decode_inputs_on_the_device(checkpoint_factory, overlap_env, monkeypatch):
    """Steps mixing prefill chunks with decodes whose input token is still on the device (placeholders the
    runner resolves) happen in the chunked-prefill scenario, and its tokens equal transformers'."""
    from atom_frontends.native.model_runner import ModelRunner

    kinds, execute = [], ModelRunner.execute

    def spy(self, batch):
        kinds.append((any(s.request.num_pending for s in batch), any(s.num_new_tokens > 1 for s in batch)))
        return execute(self, batch)

    monkeypatch.setattr(ModelRunner, "execute", spy)
    ours, want = test_parity.chunked_prefill(checkpoint_factory)
    assert ours == want
    assert (True, True) in kinds and (True, False) in kinds  # mixed steps and pure decode steps


@MODES
def test_requests_stop_exactly_mid_batch(checkpoint_factory, overlap):
    """EOS, a stop token, max_tokens=1, max_tokens and n=3 in one batch, ending at different
    steps while the others go on: each equals transformers' tokens cut at its stop, no token more."""
    path = checkpoint_factory("LlamaForCausalLM")
    prompts = random_prompts([13, 9, 21, 6, 17, 11], seed=71)
    ref = hf_greedy(path, prompts, NEW)  # each cut at the checkpoint's EOS, as ours
    llm = LLM(path, block_size=4, num_kv_blocks=256, overlap_scheduling=overlap)
    eos = llm.engine.eos_token_ids | {ref[0][5]}  # one more EOS: request 0 (and any other) ends at it
    params = [GREEDY, SamplingParams(temperature=0.0, max_tokens=NEW, stop_token_ids=[ref[1][3]]),
              SamplingParams(temperature=0.0, max_tokens=1), SamplingParams(temperature=0.0, max_tokens=7),
              SamplingParams(temperature=0.0, max_tokens=12), SamplingParams(temperature=0.0, max_tokens=NEW, n=3)]
    llm.engine.eos_token_ids = eos
    outs = llm.generate(prompts, params, use_tqdm=False)
    want = [truncated(r, p, eos) for r, p in zip(ref, params)]
    got = [[(c.token_ids, c.finish_reason) for c in o.outputs] for o in outs]
    assert got == [[w] * p.n for w, p in zip(want, params)]
    assert len({len(w[0]) for w in want}) >= 4  # they do end at different steps
    assert_all_free(llm)


@MODES
def test_stop_strings_in_a_batch(checkpoint_factory, overlap):
    """A stop string ends one request mid-batch: its text and tokens equal the tokenizer's decode of
    transformers' tokens cut at the string."""
    path = checkpoint_factory("LlamaForCausalLM")
    llm = LLM(path, block_size=4, num_kv_blocks=256, overlap_scheduling=overlap)
    tok = llm.tokenizer
    prompts = random_prompts([12, 8, 15], seed=72)
    ref = hf_greedy(path, prompts, NEW)
    full = tok.decode(ref[0], skip_special_tokens=True)
    stop = next(full[i : i + 2] for i in range(len(full) // 3, len(full) - 2) if "\ufffd" not in full[i : i + 2])
    k = next(k for k in range(1, NEW + 1) if stop in tok.decode(ref[0][:k], skip_special_tokens=True))
    outs = llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=NEW, stop=stop), GREEDY, GREEDY],
                        use_tqdm=False)
    c = outs[0].outputs[0]
    text = tok.decode(ref[0][:k], skip_special_tokens=True)
    assert (c.token_ids, c.text, c.finish_reason, c.stop_reason) == (ref[0][:k], text[: text.find(stop)], "stop",
                                                                      stop)
    assert k < NEW and [o.outputs[0].token_ids for o in outs[1:]] == ref[1:]
    assert_all_free(llm)


@MODES
def test_eos_under_preemption_and_prefix_caching(checkpoint_factory, overlap):
    """A KV cache too small for all requests (preemptions) with a shared prefix (cache hits), some requests
    ending at EOS: tokens equal transformers', every block free at the end."""
    path = checkpoint_factory("Qwen3ForCausalLM")
    shared = random_prompts([24], seed=73)[0]
    prompts = [shared + t for t in random_prompts([30, 21, 36, 10, 17], seed=74)]
    ref = hf_greedy(path, prompts, NEW)
    llm = LLM(path, block_size=4, num_kv_blocks=40, max_model_len=128, max_num_batched_tokens=16,
              overlap_scheduling=overlap)
    eos = llm.engine.eos_token_ids | {r[len(r) // 2] for r in ref[1::2]}
    llm.engine.eos_token_ids = eos
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0 and any(o.num_cached_tokens for o in outs)
    assert [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs] == [truncated(r, GREEDY, eos)
                                                                                    for r in ref]
    assert_all_free(llm)


@torch.inference_mode()
def hf_generate(path, prompt: list[int], device: str = "cpu", **kwargs) -> list[int]:
    model = hf_model(path, torch.float32, device)
    ids = torch.tensor([prompt], device=device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, **kwargs)
    return out[0, len(prompt):].tolist()


def penalties_and_min_tokens(path, make_llm: Callable[[str], LLM],
                             device: str = "cpu") -> tuple[list[list[int]], list[list[int]]]:
    """(ours from make_llm(path), transformers' on `device`) for greedy with HF's repetition penalty, and for
    min_tokens holding off a stop token that comes early: both read every output token, the one still on the
    device included."""
    prompts = random_prompts([10, 16], seed=75)
    pen = [hf_generate(path, p, device, max_new_tokens=NEW, repetition_penalty=r) for p, r in zip(prompts, PENALTIES)]
    plain = hf_greedy(path, prompts, NEW, torch.float32, device)
    assert pen != plain  # the penalty changes the tokens
    stop = plain[1][1]
    held = hf_generate(path, prompts[1], device, max_new_tokens=NEW, min_new_tokens=6, eos_token_id=[2, stop])
    assert held[1] != stop  # held off
    llm = make_llm(path)
    assert llm.engine.eos_token_ids == {2}
    outs = llm.generate(prompts + [prompts[1]],
                        [SamplingParams(temperature=0.0, max_tokens=NEW, repetition_penalty=r) for r in PENALTIES]
                        + [SamplingParams(temperature=0.0, max_tokens=NEW, min_tokens=6, stop_token_ids=[stop])],
                        use_tqdm=False)
    assert_all_free(llm)
    return [o.outputs[0].token_ids for o in outs], pen + [held]


def cpu_penalties_and_min_tokens(checkpoint_factory, overlap: bool) -> tuple[list[list[int]], list[list[int]]]:
    return penalties_and_min_tokens(checkpoint_factory("LlamaForCausalLM"),
                                    lambda path: LLM(path, block_size=4, num_kv_blocks=256, overlap_scheduling=overlap))


@MODES
def test_repetition_penalty_and_min_tokens_match_transformers(checkpoint_factory, overlap):
    ours, want = cpu_penalties_and_min_tokens(checkpoint_factory, overlap)
    assert ours == want


def test_sampling_logprobs_and_penalties_do_not_depend_on_overlap(checkpoint_factory):
    """Seeded sampling (n=2), presence/frequency penalties, logprobs and prompt logprobs give the same
    outputs with overlap on as off (off is checked against transformers in test_logprobs/test_penalties)."""
    path = checkpoint_factory("Qwen3ForCausalLM")
    prompts = random_prompts([14, 7, 30], seed=76)
    params = SamplingParams(temperature=0.9, top_k=50, seed=3, n=2, presence_penalty=0.8, frequency_penalty=0.6,
                            max_tokens=16, logprobs=2, prompt_logprobs=1, ignore_eos=True)
    runs = []
    for overlap in (False, True):
        llm = LLM(path, block_size=4, num_kv_blocks=256, max_num_batched_tokens=16, overlap_scheduling=overlap)
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert_all_free(llm)
        runs.append([(o.prompt_logprobs, [(c.token_ids, c.logprobs, c.cumulative_logprob) for c in o.outputs])
                     for o in outs])
    off, on = runs
    assert len({tuple(c[0]) for o in off for c in o[1]}) == 6  # samples differ: the test can tell them apart
    for a, b in zip(off, on):
        assert [c[0] for c in a[1]] == [c[0] for c in b[1]]
        assert _logprob_values(a) == pytest.approx(_logprob_values(b), abs=1e-5)


def _logprob_values(out) -> list[float]:
    prompt, samples = out
    values = [lp.logprob for d in prompt[1:] for lp in d.values()]
    for _, logprobs, cumulative in samples:
        values += [lp.logprob for d in logprobs for lp in d.values()] + [cumulative]
    return values


@MODES
def test_abort_mid_stream(checkpoint_factory, overlap):
    """A request aborted while decoding returns the tokens it had (a prefix of transformers'), none from the
    step in flight; the others finish equal to transformers'; every block comes back."""
    path = checkpoint_factory("LlamaForCausalLM")
    prompts = random_prompts([13, 9, 6], seed=77)
    ref = hf_greedy(path, prompts, NEW)
    llm = LLM(path, block_size=4, num_kv_blocks=256, overlap_scheduling=overlap)
    engine = llm.engine
    assert min(len(r) for r in ref) > 8
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    done = {}
    for _ in range(6):
        done.update({o.request_id: o for o in engine.step()})
    seen = engine.current_output(ids[1]).outputs[0].token_ids
    assert engine.abort(ids[1])
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step()})
    aborted = done[ids[1]].outputs[0]
    assert (aborted.token_ids, aborted.finish_reason) == (seen, "abort")
    # 6 steps sampled 6 tokens; with overlap the 6th was still on the device
    assert seen == ref[1][: 5 if overlap else 6]
    assert [done[ids[0]].outputs[0].token_ids, done[ids[2]].outputs[0].token_ids] == [ref[0], ref[2]]
    assert_all_free(llm)


@MODES
def test_tokens_are_read_after_the_next_step_is_launched(checkpoint_factory, monkeypatch, overlap):
    """The order of the device work and its one read per step: with overlap, step n's results are read after
    step n+1 is launched (the CPU prepared n+1 without waiting for n); without, right after step n."""
    path = checkpoint_factory("LlamaForCausalLM")
    llm = LLM(path, block_size=4, num_kv_blocks=256, overlap_scheduling=overlap)
    events = []
    execute, results = llm.engine.runner.execute, StepOutput.results

    def launch(batch):
        out = execute(batch)
        out.step = sum(e[0] == "launch" for e in events)
        events.append(("launch", out.step))
        return out

    def read(self):
        events.append(("read", self.step))
        return results(self)

    monkeypatch.setattr(llm.engine.runner, "execute", launch)
    monkeypatch.setattr(StepOutput, "results", read)
    outs = llm.generate(random_prompts([5, 8], seed=78), SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 6 for o in outs)
    n = sum(e[0] == "launch" for e in events)
    if overlap:
        want = [("launch", 0)] + [e for k in range(1, n) for e in (("launch", k), ("read", k - 1))] + [("read", n - 1)]
    else:
        want = [e for k in range(n) for e in (("launch", k), ("read", k))]
    assert events == want


def test_canary_a_stale_token_as_input_is_caught(checkpoint_factory, overlap_env, monkeypatch):
    """Break the bookkeeping on purpose: a decode whose token is still on the device reads the last token the
    host knows instead (one step stale). The parity comparison must fail."""
    tokens = inputs_module._tokens

    def stale(r, start, n):
        if r.num_pending:
            return (r.prompt_token_ids + r.output_token_ids)[-1:]
        return tokens(r, start, n)

    monkeypatch.setattr(inputs_module, "_tokens", stale)
    ours, want = test_parity.plain(checkpoint_factory)
    assert ours != want


def test_canary_penalties_missing_the_token_on_the_device_are_caught(checkpoint_factory, monkeypatch):
    """Break the bookkeeping on purpose: penalties that leave out the token still on the device (the host's
    lists lag one token). The repetition-penalty comparison with transformers must fail."""
    apply = sampler_module.apply_penalties

    def lagging(logits, reqs, last=None):
        saved = [r.num_pending for r in reqs]
        for r in reqs:
            r.num_pending = 0
        try:
            return apply(logits, reqs, last)
        finally:
            for r, k in zip(reqs, saved):
                r.num_pending = k

    monkeypatch.setattr(sampler_module, "apply_penalties", lagging)
    ours, want = cpu_penalties_and_min_tokens(checkpoint_factory, overlap=True)
    assert ours[:2] != want[:2]


def test_the_switch(checkpoint_factory, monkeypatch):
    """EngineArgs.overlap_scheduling wins over ATOM_OVERLAP_SCHEDULING, which sets the default (off on CPU);
    bad values name the fix."""
    path = checkpoint_factory("LlamaForCausalLM")
    monkeypatch.delenv("ATOM_OVERLAP_SCHEDULING", raising=False)
    assert not LLM(path, num_kv_blocks=64).engine.overlap  # CPU default
    monkeypatch.setenv("ATOM_OVERLAP_SCHEDULING", "1")
    assert LLM(path, num_kv_blocks=64).engine.overlap
    assert not LLM(path, num_kv_blocks=64, overlap_scheduling=False).engine.overlap
    with pytest.raises(TypeError, match="overlap_scheduling must be a bool or None"):
        LLM(path, overlap_scheduling="yes")
    monkeypatch.setenv("ATOM_OVERLAP_SCHEDULING", "sometimes")
    with pytest.raises(ValueError, match="ATOM_OVERLAP_SCHEDULING='sometimes': use 1/0"):
        LLM(path, num_kv_blocks=64)
