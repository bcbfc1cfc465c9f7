"""RequestStream merges the news the consumer has not taken yet by sample: a sample that ended a step before the
others is absent from the request's later outputs (the server's RequestState drops an ended sample), and its last
tokens and finish must still reach the consumer."""

from __future__ import annotations

import asyncio

from atom_frontends.native.output_processor import RequestState
from atom_frontends.native.request import CompletionOutput, RequestOutput
from atom_frontends.native.request_stream import RequestStream
from atom_frontends.native.sampling_params import SamplingParams


def _output(samples: dict[int, tuple[list[int], str | None]], finished: bool) -> RequestOutput:
    outs = [CompletionOutput(i, "", ids, None, [{t: None} for t in ids], reason)
            for i, (ids, reason) in samples.items()]
    return RequestOutput("r", None, [1, 2], None, outs, finished, 0)


async def _collect(puts: list[RequestOutput], consume_between: bool) -> dict[int, tuple[list[int], int, str]]:
    stream = RequestStream(lambda rid: None, RequestState("r", None, [1, 2], SamplingParams(n=3, logprobs=0), None))
    got: dict[int, tuple[list[int], int, str]] = {}

    async def consume() -> None:
        async for d in stream:
            for c in d.outputs:
                ids, rows, reason = got.get(c.index, ([], 0, None))
                got[c.index] = (ids + c.token_ids, rows + len(c.logprobs), c.finish_reason or reason)

    task = asyncio.ensure_future(consume())
    for out in puts:
        stream.put(out)
        if consume_between:
            await asyncio.sleep(0)
    await task
    return got


def test_a_sample_ending_early_keeps_its_last_tokens_when_news_are_merged():
    # step 1: sample 0 takes its last token and ends; step 2: samples 1 and 2 end (sample 0 no longer listed)
    puts = [_output({0: ([5, 6], "length"), 1: ([7], None), 2: ([8], None)}, finished=False),
            _output({1: ([9], "length"), 2: ([10], "length")}, finished=True)]
    want = {0: ([5, 6], 2, "length"), 1: ([7, 9], 2, "length"), 2: ([8, 10], 2, "length")}
    for consume_between in (True, False):  # False: the second output arrives before the first was taken
        assert asyncio.run(_collect(puts, consume_between)) == want
