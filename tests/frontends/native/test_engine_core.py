"""The engine core of `atom-core serve`, driven in-process (the commands its process takes): the deltas hold only
each request's new token ids, joined they are transformers' greedy tokens; a failing step fails the requests in
flight and the engine goes on serving; shutdown's abort and a server-found stop string free the blocks."""

from __future__ import annotations

import pytest

from atom_frontends.native.engine import LLMEngine
from atom_frontends.native.engine_args import EngineArgs
from atom_frontends.native.engine_core import EngineCore
from atom_frontends.native.sampling_params import SamplingParams
from tests.frontends.native.hf_oracle import hf_greedy, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def path(checkpoint_factory):
    return checkpoint_factory("Qwen3ForCausalLM")


def _core(path) -> EngineCore:
    return EngineCore(LLMEngine(EngineArgs(str(path), block_size=8, num_kv_blocks=256, skip_tokenizer_init=True)))


def _run(core: EngineCore, requests: dict[str, list[int]], params=GREEDY) -> dict[str, list]:
    """Add the requests, step until none is live; each request's deltas."""
    for rid, ids in requests.items():
        assert core.handle(("add", rid, ids, params)) == []
    deltas: dict[str, list] = {rid: [] for rid in requests}
    while core.live:
        for d in core.step():
            deltas[d.request_id].append(d)
    return deltas


def _tokens(deltas) -> list[int]:
    return [t for d in deltas for c in d.outputs for t in c.token_ids]


def test_deltas_hold_only_new_tokens(path):
    prompts = random_prompts([9, 14, 6], seed=60)
    deltas = _run(_core(path), {f"r{i}": p for i, p in enumerate(prompts)})
    for ds in deltas.values():
        assert all(len(c.token_ids) == 1 and c.text == "" for d in ds for c in d.outputs)  # one step, one token
        assert [d.finished for d in ds] == [False] * (len(ds) - 1) + [True]
        assert ds[-1].outputs[0].finish_reason == "length"
    assert [_tokens(deltas[f"r{i}"]) for i in range(3)] == hf_greedy(path, prompts, 12)


def test_a_failing_step_fails_only_the_requests_in_flight(path, monkeypatch):
    prompts = random_prompts([9, 14, 6], seed=61)
    core = _core(path)
    execute, raised = core.engine.runner.execute, []

    def flaky(batch):  # fails the first step that runs both of the first two requests
        if len(batch) == 2 and not raised:
            raised.append(True)
            raise RuntimeError("simulated device error")
        return execute(batch)

    monkeypatch.setattr(core.engine.runner, "execute", flaky)
    failed = _run(core, {"a": prompts[0], "b": prompts[1]})
    assert all("simulated device error" in ds[-1].error for ds in failed.values())
    later = _run(core, {f"r{i}": p for i, p in enumerate(prompts)})
    assert [_tokens(later[f"r{i}"]) for i in range(3)] == hf_greedy(path, prompts, 12)
    core.step()  # the failed requests' "abort" outputs come out (unclaimed)
    stats = core.stats()
    assert stats["num_free_kv_blocks"] == stats["num_kv_blocks"]  # the failed requests' blocks came back


def test_abort_and_stop_sample_free_the_blocks(path):
    core = _core(path)
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True, n=2)
    for rid in ("aborted", "stopped"):
        core.handle(("add", rid, random_prompts([20], seed=62)[0], long))
    for _ in range(3):
        core.step()
    core.handle(("abort", "aborted"))
    core.handle(("stop_sample", "stopped", 0, "xy"))
    core.handle(("stop_sample", "stopped", 1, "z"))
    ends = {d.request_id: d for d in core.step() if d.finished}
    assert [c.finish_reason for c in ends["aborted"].outputs] == ["abort", "abort"]
    assert [(c.finish_reason, c.stop_reason) for c in ends["stopped"].outputs] == [("stop", "xy"), ("stop", "z")]
    stats = core.stats()
    assert not core.live and stats["num_aborted_requests"] == 1
    assert stats["num_free_kv_blocks"] == stats["num_kv_blocks"]


def test_engine_hands_a_stream_only_what_is_new(path):
    """A streamed request's outputs hold only the tokens and logprobs since the previous output (work per step in
    the news, not in the request's length), its prompt logprobs once, whole; joined: transformers' tokens."""
    eng = LLMEngine(EngineArgs(str(path), block_size=8, num_kv_blocks=256, max_num_batched_tokens=4))
    prompt = random_prompts([9], seed=63)[0]
    rid = eng.enqueue(None, prompt, SamplingParams(temperature=0.0, max_tokens=12, logprobs=1, prompt_logprobs=1),
                      stream=True)
    chunks, prompt_logprobs = [], []
    while eng.has_unfinished():
        for out in eng.step() or [eng.current_output(rid)]:
            c = out.outputs[0]
            assert len(c.logprobs) == len(c.token_ids) <= 1
            chunks.append(c.token_ids)
            if out.prompt_logprobs is not None:
                assert c.token_ids  # with the first token: a stream yields nothing without one
                prompt_logprobs.append(out.prompt_logprobs)
    assert [t for c in chunks for t in c] == hf_greedy(path, [prompt], 12)[0]
    assert len(prompt_logprobs) == 1 and len(prompt_logprobs[0]) == len(prompt)  # chunked prefill: sent once whole
