"""RequestStream: one request's outputs as an async iterator, for a server (AsyncLLMEngine makes them)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from atom_frontends.native.output_processor import RequestState
from atom_frontends.native.request import CompletionOutput, RequestOutput


class RequestStream:
    """One request's outputs: `async for out in stream` yields RequestOutputs holding only what is new in each
    sample (text, token_ids, logprobs; finish_reason once it ends). Text that could still turn out to begin a
    stop string is held back until it cannot (vLLM does the same), so streamed text is never taken back.
    The engine process sends only what is new (engine_core.Delta), RequestState adds the text; news the consumer
    has not taken yet are merged."""

    def __init__(self, abort: Callable[[str], None], state: RequestState) -> None:
        self.state, self._abort = state, abort  # abort(request_id): the engine's
        self.request_id, self.params, self.prompt_token_ids = state.request_id, state.params, state.prompt_token_ids
        self.done = False  # the engine has delivered the final output or an error
        self._event = asyncio.Event()
        self._latest: RequestOutput | None = None
        self._error: BaseException | None = None
        self._hold = max((len(s) for s in self.params.stop), default=1) - 1
        self._sent_text = [0] * self.params.n
        self._ended = [False] * self.params.n
        self._closed = False  # the final output was yielded

    def put(self, item: RequestOutput | BaseException) -> None:  # on the event loop
        if isinstance(item, BaseException):
            self._error, self.done = item, True
        else:
            self._latest = item if self._latest is None else _merged(self._latest, item)
            self.done = item.finished
        self._event.set()

    def abort(self) -> None:
        """Stop the request (frees its KV blocks); nothing when it already ended."""
        if not self.done:
            self._abort(self.request_id)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        try:
            while True:
                if self._error is not None:
                    raise self._error
                latest, self._latest = self._latest, None
                if latest is not None:
                    delta = self._delta(latest)
                    if delta is not None:
                        self._closed = latest.finished
                        return delta
                elif self._closed:
                    raise StopAsyncIteration
                self._event.clear()
                await self._event.wait()
        except asyncio.CancelledError:  # the consumer went away: free the request's blocks
            self.abort()
            raise

    def _delta(self, out: RequestOutput) -> RequestOutput | None:
        """What `out` (the news: new tokens and logprobs, the text so far) adds to what was yielded; None when
        nothing (never when finished)."""
        outs = []
        for c in out.outputs:
            i, ended = c.index, c.finish_reason is not None
            end = len(c.text) if ended else max(self._sent_text[i], len(c.text) - self._hold)
            text = c.text[self._sent_text[i] : end]
            if not text and not c.token_ids and (self._ended[i] or not ended):
                continue
            self._sent_text[i], self._ended[i] = end, ended
            outs.append(CompletionOutput(i, text, c.token_ids, c.cumulative_logprob, c.logprobs, c.finish_reason,
                                         c.stop_reason))  # not dataclasses.replace (~3x as slow): once per chunk
        if not outs and not out.finished:
            return None
        return RequestOutput(out.request_id, out.prompt, out.prompt_token_ids, out.prompt_logprobs, outs, out.finished,
                             out.num_cached_tokens)


def _merged(old: RequestOutput, new: RequestOutput) -> RequestOutput:
    """Two outputs of news as one, sample by sample (by index: a sample that ended is absent from later outputs,
    and keeps what it had); old's lists, which the stream owns, grow."""
    samples = {o.index: o for o in old.outputs}
    for c in new.outputs:
        o = samples.get(c.index)
        if o is not None:
            o.token_ids += c.token_ids
            if o.logprobs is not None:
                o.logprobs += c.logprobs
            c = replace(c, token_ids=o.token_ids, logprobs=o.logprobs)
        samples[c.index] = c
    outs = [samples[i] for i in sorted(samples)]
    return replace(new, outputs=outs, prompt_logprobs=old.prompt_logprobs or new.prompt_logprobs)
