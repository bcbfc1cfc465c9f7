"""AsyncLLMEngine: the native engine behind asyncio, for a server.

One thread owns the LLMEngine (and its tokenizer): it takes commands (add, abort, stop) from a queue, runs
step() while work remains and hands each live request what is new in its output to the event loop. Coroutines add
requests at any time (they join the running batch: continuous batching across callers) and iterate a
RequestStream of deltas. A stream closed or cancelled early aborts its request, which frees its KV blocks.
An error stays with its request: a bad prompt fails that request's add; a failing step fails the requests
in flight, and the loop goes on serving new ones.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import replace

from atom_frontends.native.engine import LLMEngine
from atom_frontends.native.llm import render_chat
from atom_frontends.native.request import RequestOutput
from atom_frontends.native.sampling_params import SamplingParams

log = logging.getLogger(__name__)

Prepare = Callable[[LLMEngine], tuple[str | None, list[int]]]  # runs on the engine thread: (text, token ids)


class QueueFullError(RuntimeError):
    """More sequences in flight than the engine runs at once plus its waiting queue (a server answers 503)."""


class EngineStoppedError(RuntimeError):
    """The engine is shutting down or has stopped (a server answers 503)."""


class RequestStream:
    """One request's outputs: `async for out in stream` yields RequestOutputs holding only what is new in each
    sample (text, token_ids, logprobs; finish_reason once it ends). Text that could still turn out to begin a
    stop string is held back until it cannot (vLLM does the same), so streamed text is never taken back.
    The engine hands the stream only what is new (LLMEngine.enqueue(stream=True)); news the consumer has not
    taken yet are merged."""

    def __init__(self, engine: AsyncLLMEngine, request_id: str, params: SamplingParams) -> None:
        self.request_id, self.params, self._engine = request_id, params, engine
        self.accepted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.done = False  # the engine has delivered the final output or an error
        self.prompt_token_ids: list[int] = []  # set once the engine thread accepted the request
        self._event = asyncio.Event()
        self._latest: RequestOutput | None = None
        self._error: BaseException | None = None
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        self._sent_text = [0] * params.n
        self._ended = [False] * params.n
        self._closed = False  # the final output was yielded

    def _put(self, item: RequestOutput | BaseException) -> None:  # on the event loop
        if isinstance(item, BaseException):
            self._error, self.done = item, True
        else:
            self._latest = item if self._latest is None else _merged(self._latest, item)
            self.done = item.finished
        self._event.set()

    def abort(self) -> None:
        """Stop the request (frees its KV blocks); nothing when it already ended."""
        if not self.done:
            self._engine.abort(self.request_id)

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
            outs.append(replace(c, text=text))
        if not outs and not out.finished:
            return None
        return replace(out, outputs=outs)


def _merged(old: RequestOutput, new: RequestOutput) -> RequestOutput:
    """Two outputs of news (one sample each in the same order) as one; old's lists, which the stream owns, grow."""
    for o, c in zip(old.outputs, new.outputs):
        o.token_ids += c.token_ids
        if o.logprobs is not None:
            o.logprobs += c.logprobs
    outs = [replace(c, token_ids=o.token_ids, logprobs=o.logprobs) for o, c in zip(old.outputs, new.outputs)]
    return replace(new, outputs=outs, prompt_logprobs=old.prompt_logprobs or new.prompt_logprobs)


class AsyncLLMEngine:
    """`await add_request(...)` → RequestStream. At most max_num_seqs + max_queue sequences (a request with
    n samples counts n) are in flight; one more raises QueueFullError instead of growing without bound."""

    def __init__(self, engine: LLMEngine, max_queue: int = 256) -> None:
        if not isinstance(max_queue, int) or max_queue < 0:
            raise ValueError(f"max_queue must be an int >= 0, got {max_queue!r}")
        self.engine, self.max_queue = engine, max_queue
        self.capacity = engine.config.max_num_seqs + max_queue
        self._commands: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._in_flight = 0  # sequences added and not yet ended (event-loop side)
        self._live: dict[str, RequestStream] = {}  # engine-thread side: the requests it runs
        self._accepting = False
        self.num_aborted = 0  # requests stopped early (client gone, shutdown)
        self.stats = self._engine_stats()

    # ---- event-loop side --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread; call from the event loop that will use this engine."""
        if self._thread is not None:
            raise RuntimeError("AsyncLLMEngine.start() was already called")
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="atom-core-engine", daemon=True)
        self._accepting = True
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._accepting and self._thread is not None and self._thread.is_alive()

    async def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                          request_id: str | None = None) -> RequestStream:
        """Queue a prompt (str or token ids); raises ValueError/TypeError for a bad prompt or params (nothing
        is queued), QueueFullError past the bound, EngineStoppedError once shut down."""
        return await self._add(lambda eng: eng.check_prompt(prompt), params, request_id)

    async def add_chat_request(self, messages: list[dict], params: SamplingParams | None = None,
                               request_id: str | None = None, chat_template: str | None = None,
                               add_generation_prompt: bool = True,
                               chat_template_kwargs: dict | None = None) -> RequestStream:
        """Queue a conversation rendered with the checkpoint's chat template (as LLM.chat renders it)."""
        def prepare(eng: LLMEngine) -> tuple[str | None, list[int]]:
            if eng.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer: chat needs one with a chat template")
            text, ids = render_chat(eng.tokenizer, messages, chat_template, add_generation_prompt,
                                    chat_template_kwargs or {})
            eng.validate_prompt(ids)
            return text, ids

        return await self._add(prepare, params, request_id)

    async def _add(self, prepare: Prepare, params: SamplingParams | None, request_id: str | None) -> RequestStream:
        if not self.running:
            raise EngineStoppedError("the engine is not running (shutting down or stopped)")
        params = self.engine.check_params(params)
        if params.n > self.capacity:
            raise ValueError(f"n={params.n} samples are more than this engine holds at once ({self.capacity}: "
                             "max_num_seqs + max_queue); ask for fewer")
        if self._in_flight + params.n > self.capacity:
            raise QueueFullError(
                f"the engine is full: {self._in_flight} sequences in flight, at most {self.capacity} "
                f"(max_num_seqs={self.engine.config.max_num_seqs} running + max_queue={self.max_queue} "
                f"waiting); this request asks for {params.n}. Retry later")
        stream = RequestStream(self, request_id or f"req-{next(self._ids)}", params)
        self._in_flight += params.n
        self._commands.put(lambda: self._enqueue(stream, prepare))
        try:
            await stream.accepted
        except asyncio.CancelledError:
            stream.abort()
            raise
        return stream

    def abort(self, request_id: str) -> None:
        if self._thread is not None:
            self._commands.put(lambda: self._abort(request_id))

    def _deliver(self, items: list[tuple[RequestStream, RequestOutput | BaseException]]) -> None:
        for stream, item in items:
            if stream.done:
                continue
            stream._put(item)
            if stream.done:
                self._in_flight -= stream.params.n

    def _accept(self, stream: RequestStream, error: BaseException | None) -> None:
        if stream.accepted.done():  # the caller was cancelled meanwhile
            return
        if error is None:
            stream.accepted.set_result(None)
        else:
            stream.accepted.set_exception(error)

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Stop taking requests, let those in flight finish for up to `timeout` seconds, abort the rest and
        stop the engine thread (waited for up to `timeout` seconds more)."""
        self._accepting = False
        if self._thread is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        self._commands.put(None)
        await asyncio.to_thread(self._thread.join, max(deadline - loop.time(), 1.0))
        if self._thread.is_alive():
            log.warning("atom-core: the engine thread did not stop within %.0f s (a step still running)", timeout)

    # ---- engine-thread side -----------------------------------------------------------------------
    def _call_loop(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is waiting any more
            pass

    def _enqueue(self, stream: RequestStream, prepare: Prepare) -> None:
        try:
            text, ids = prepare(self.engine)
            self.engine.enqueue(text, ids, stream.params, stream.request_id, stream=True)
        except Exception as e:  # a bad prompt, a duplicate id: this request fails, no other
            self._call_loop(self._accept, stream, e)
            self._call_loop(self._deliver, [(stream, e)])
            return
        self._live[stream.request_id] = stream
        stream.prompt_token_ids = ids  # read on the event loop after `accepted` resolves
        self._call_loop(self._accept, stream, None)

    def _abort(self, request_id: str) -> None:
        if request_id in self._live and self.engine.abort(request_id):
            self.num_aborted += 1  # its output ("abort") comes out of the next step, to the stream

    def _engine_stats(self) -> dict[str, int]:
        eng = self.engine
        sched, bm = eng.scheduler, eng.block_manager
        return {"num_kv_blocks": bm.num_blocks, "num_free_kv_blocks": bm.num_free_blocks,
                "num_running_seqs": len(sched.running), "num_waiting_seqs": len(sched.waiting),
                "num_requests": len(self._live), "num_aborted_requests": self.num_aborted,
                "num_preemptions": sched.num_preemptions}

    def _run(self) -> None:
        stopping = False
        while not stopping:
            block = not self.engine.has_unfinished()
            while True:  # every command waiting now; wait for one when there is nothing to step
                try:
                    command = self._commands.get(block=block)
                except queue.Empty:
                    break
                block = False
                if command is None:
                    stopping = True
                    break
                try:
                    command()
                except Exception:  # commands fail their own request; this is a bug, but the loop must go on
                    log.exception("atom-core: an engine command failed")
            if stopping:
                for rid in list(self._live):
                    self._abort(rid)
            self._step()
            self.stats = self._engine_stats()  # replaced whole: readers on other threads see one snapshot

    def _step(self) -> None:
        """One engine step; hand every live request what is new in its output (or its error)."""
        eng, items = self.engine, []
        try:
            finished = {out.request_id: out for out in eng.step()} if eng.has_unfinished() else {}
        except Exception as e:
            log.exception("atom-core: an engine step failed; failing the %d requests in flight", len(self._live))
            for rid, stream in self._live.items():
                eng.abort(rid)
                items.append((stream, RuntimeError(f"the engine failed while running this request: {e!r}")))
            self._live.clear()  # their "abort" outputs come out of the next step, unclaimed
            self._call_loop(self._deliver, items)
            return
        for rid, stream in list(self._live.items()):
            out = finished.get(rid)
            try:
                out = out if out is not None else eng.current_output(rid)
            except Exception as e:  # building one request's output failed: that request ends, others go on
                log.exception("atom-core: request %s failed", rid)
                eng.abort(rid)
                out = RuntimeError(f"the engine failed while running this request: {e!r}")
            if out is None:  # not in the engine (cannot happen: aborts come out of step() first)
                continue
            if not isinstance(out, RequestOutput) or out.finished:
                del self._live[rid]
            items.append((stream, out))
        if items:
            self._call_loop(self._deliver, items)

