"""AsyncLLMEngine in-process: a failing engine step fails the requests in flight and the loop goes on serving
(answers still equal transformers'); shutdown aborts what is in flight and refuses new requests."""

from __future__ import annotations

import asyncio

import pytest

from atom_frontends.native.async_engine import AsyncLLMEngine, EngineStoppedError
from atom_frontends.native.engine import LLMEngine
from atom_frontends.native.engine_args import EngineArgs
from atom_frontends.native.sampling_params import SamplingParams
from tests.frontends.native.hf_oracle import hf_greedy, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def path(checkpoint_factory):
    return checkpoint_factory("Qwen3ForCausalLM")


def _engine(path) -> AsyncLLMEngine:
    return AsyncLLMEngine(LLMEngine(EngineArgs(str(path), block_size=8, num_kv_blocks=256)), max_queue=4)


async def _tokens(stream) -> tuple[list[int], str | None]:
    tokens, reason = [], None
    async for out in stream:
        for c in out.outputs:
            tokens += c.token_ids
            reason = c.finish_reason or reason
    return tokens, reason


def test_a_failing_step_fails_only_the_requests_in_flight(path, monkeypatch):
    prompts = random_prompts([9, 14, 6], seed=61)
    want = hf_greedy(path, prompts, 12)

    async def main():
        ae = _engine(path)
        execute, raised = ae.engine.runner.execute, []

        def flaky(batch):  # fails the first step that runs both of the first two requests
            if len(batch) == 2 and not raised:
                raised.append(True)
                raise RuntimeError("simulated device error")
            return execute(batch)

        monkeypatch.setattr(ae.engine.runner, "execute", flaky)
        ae.start()
        first = [await ae.add_request(p, GREEDY) for p in prompts[:2]]
        for s in first:
            with pytest.raises(RuntimeError, match="simulated device error"):
                await _tokens(s)
        later = await asyncio.gather(*[_tokens(await ae.add_request(p, GREEDY)) for p in prompts])
        await ae.shutdown(1)
        return later, ae.stats  # the engine thread's last snapshot, taken after its last step

    later, stats = asyncio.run(main())
    assert [t for t, _ in later] == want and all(r == "length" for _, r in later)
    assert stats["num_free_kv_blocks"] == stats["num_kv_blocks"]  # the failed requests' blocks came back


def test_shutdown_aborts_in_flight_and_refuses_new(path):
    async def main():
        ae = _engine(path)
        ae.start()
        stream = await ae.add_request(random_prompts([8], seed=62)[0],
                                      SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True))
        first = await stream.__anext__()
        await ae.shutdown(timeout=0.0)
        rest, reason = await _tokens(stream)
        with pytest.raises(EngineStoppedError):
            await ae.add_request("hello", GREEDY)
        return len(first.outputs[0].token_ids) + len(rest), reason, ae.stats

    n, reason, stats = asyncio.run(main())
    assert reason == "abort" and n < 400
    assert stats["num_aborted_requests"] == 1 and stats["num_free_kv_blocks"] == stats["num_kv_blocks"]


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
