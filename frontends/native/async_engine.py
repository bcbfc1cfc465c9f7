"""AsyncLLMEngine: the server process's handle on the engine process (engine_core), for asyncio.

The engine runs in a process of its own (multiprocessing, spawn: torch and fork do not mix), so its steps never
wait for the event loop and the event loop's HTTP, tokenizing and detokenizing never wait for a step. Here,
in the server process: prompts are tokenized and checked, requests are bounded (503 past the bound), and a
reader thread takes the engine's per-step news to the event loop, where RequestState turns token ids into
text and each request's RequestStream yields it. A stream closed or cancelled early aborts its request, which
frees its KV blocks. An engine process that dies fails every request in flight and every later one with
EngineDeadError (a server answers 503 and stops).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable

from atom_frontends.native.checkpoint_files import load_tokenizer
from atom_frontends.native.engine_args import EngineArgs
from atom_frontends.native.engine_core import IDLE_POLL_S, run_engine_core
from atom_frontends.native.input_checks import InputChecks
from atom_frontends.native.llm import render_chat
from atom_frontends.native.output_processor import RequestState
from atom_frontends.native.request_stream import RequestStream
from atom_frontends.native.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """More sequences in flight than the engine runs at once plus its waiting queue (a server answers 503)."""


class EngineStoppedError(RuntimeError):
    """The engine is shutting down or has stopped (a server answers 503)."""


class EngineDeadError(EngineStoppedError):
    """The engine process died: nothing more can be served (a server answers 503 and exits non-zero)."""


class AsyncLLMEngine:
    """`await add_request(...)` → RequestStream. At most max_num_seqs + max_queue sequences (a request with
    n samples counts n) are in flight; one more raises QueueFullError instead of growing without bound.
    observers: objects with on_add(state), on_output(state, RequestOutput | error, time), on_stats(stats), called
    on the event loop (metrics, request logs). on_dead: called once on the event loop if the engine dies."""

    def __init__(self, args: EngineArgs, max_queue: int = 256) -> None:
        if not isinstance(max_queue, int) or max_queue < 0:
            raise ValueError(f"max_queue must be an int >= 0, got {max_queue!r}")
        ctx = mp.get_context("spawn")
        self._inbox, self._outbox = ctx.Queue(), ctx.Queue()
        self._inbox.cancel_join_thread()  # exiting never waits on a dead engine to read its commands
        self.process = ctx.Process(target=run_engine_core, args=(args, self._inbox, self._outbox),
                                   name="atom-core-engine", daemon=True)
        self.process.start()
        self.tokenizer = load_tokenizer(args.model)  # while the engine process loads the model
        info = self._wait_ready()
        self.max_model_len, self.max_queue = info["max_model_len"], max_queue
        self.inputs = InputChecks(self.tokenizer, info["vocab_size"], self.max_model_len)
        self.capacity = info["max_num_seqs"] + max_queue
        self.stats = {**info["stats"], "engine_pid": info["pid"]}
        self.observers: list = []
        self.on_dead: Callable[[], None] | None = None
        self.dead_reason: str | None = None
        self._ids = itertools.count()
        self._streams: dict[str, RequestStream] = {}
        self._in_flight = 0  # sequences added and not yet ended
        self._accepting = self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _wait_ready(self) -> dict:
        while True:
            try:
                msg = self._outbox.get(timeout=IDLE_POLL_S)
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(f"the engine process exited with {self.process.exitcode} while loading "
                                       "the model; its error is in the log above") from None
                continue
            if msg[0] == "failed":  # the engine's own error (e.g. a ValueError naming the argument to change)
                self.process.join()
                raise msg[1]
            return msg[1]

    # ---- event-loop side --------------------------------------------------------------------------
    def start(self) -> None:
        """Start taking the engine's news; call from the event loop that will use this engine."""
        if self._thread is not None:
            raise RuntimeError("AsyncLLMEngine.start() was already called")
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._read, name="atom-core-engine-reader", daemon=True)
        self._accepting = True
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._accepting and self.dead_reason is None

    def _check_running(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        if not self.running:
            raise EngineStoppedError("the engine is not running (shutting down or stopped)")

    async def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                          request_id: str | None = None) -> RequestStream:
        """Queue a prompt (str or token ids); raises ValueError/TypeError for a bad prompt or params (nothing
        is queued), QueueFullError past the bound, EngineStoppedError once shut down."""
        self._check_running()
        params = self.inputs.check_params(params)
        return self._add(*self.inputs.check_prompt(prompt), params, request_id)

    async def add_chat_request(self, messages: list[dict], params: SamplingParams | None = None,
                               request_id: str | None = None, chat_template: str | None = None,
                               add_generation_prompt: bool = True,
                               chat_template_kwargs: dict | None = None) -> RequestStream:
        """Queue a conversation rendered with the checkpoint's chat template (as LLM.chat renders it)."""
        self._check_running()
        params = self.inputs.check_params(params)
        if self.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer: chat needs one with a chat template")
        text, ids = render_chat(self.tokenizer, messages, chat_template, add_generation_prompt,
                                chat_template_kwargs or {})
        self.inputs.validate_prompt(ids)
        return self._add(text, ids, params, request_id)

    def _add(self, text: str | None, ids: list[int], params: SamplingParams, request_id: str | None) -> RequestStream:
        if params.n > self.capacity:
            raise ValueError(f"n={params.n} samples are more than this engine holds at once ({self.capacity}: "
                             "max_num_seqs + max_queue); ask for fewer")
        if self._in_flight + params.n > self.capacity:
            raise QueueFullError(
                f"the engine is full: {self._in_flight} sequences in flight, at most {self.capacity} "
                f"(max_num_seqs={self.capacity - self.max_queue} running + max_queue={self.max_queue} "
                f"waiting); this request asks for {params.n}. Retry later")
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"request_id {rid!r} is already in use; give each live request its own id")
        stream = RequestStream(self.abort, RequestState(rid, text, ids, params, self.tokenizer))
        self._streams[rid] = stream
        self._in_flight += params.n
        self._inbox.put(("add", rid, ids, params))
        for o in self.observers:
            o.on_add(stream.state)
        return stream

    def abort(self, request_id: str) -> None:
        if self.dead_reason is None:
            self._inbox.put(("abort", request_id))

    def _on_step(self, deltas: list, stats: dict) -> None:
        """The engine's news of one step: each request's delta to its stream, stop strings back to the engine."""
        now = time.monotonic()
        for d in deltas:
            stream = self._streams.get(d.request_id)
            if stream is None:  # ended here already (stop strings, an error)
                continue
            if d.error is not None:
                out = RuntimeError(d.error)
            else:
                out, stops = stream.state.update(d)
                for index, stop in stops:
                    self._inbox.put(("stop_sample", d.request_id, index, stop))
            self._deliver(stream, out, now)
        self.stats = {**stats, "engine_pid": self.stats["engine_pid"]}
        for o in self.observers:
            o.on_stats(self.stats)

    def _deliver(self, stream: RequestStream, out, now: float) -> None:
        stream.put(out)
        for o in self.observers:
            o.on_output(stream.state, out, now)
        if stream.done:
            del self._streams[stream.request_id]
            self._in_flight -= stream.params.n

    def _died(self) -> None:
        if self._stopping:
            return
        self.dead_reason = (f"the engine process died (exit code {self.process.exitcode}): this server cannot "
                            "serve any more and is stopping; restart it")
        log.error("atom-core: %s", self.dead_reason)
        self._accepting = False
        for stream in list(self._streams.values()):
            self._deliver(stream, EngineDeadError(self.dead_reason), time.monotonic())
        if self.on_dead is not None:
            self.on_dead()

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Stop taking requests, let those in flight finish for up to `timeout` seconds, then stop the engine
        process (it aborts what is left; waited for up to `timeout` seconds more, then terminated)."""
        self._accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._in_flight and self.dead_reason is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
        self._stopping = True
        if self.process.is_alive():
            self._inbox.put(("shutdown",))
            await asyncio.to_thread(self.process.join, max(deadline - loop.time(), 1.0))
        self.close()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, IDLE_POLL_S * 2)

    def close(self) -> None:
        """Stop the engine process now (no draining)."""
        self._stopping = True
        if self.process.is_alive():
            log.warning("atom-core: the engine process did not stop in time; terminating it")
            self.process.terminate()
            self.process.join(10)

    # ---- reader thread ----------------------------------------------------------------------------
    def _read(self) -> None:
        """Hand each engine message to the event loop until the engine stops or dies."""
        while True:
            try:
                msg = self._outbox.get(timeout=IDLE_POLL_S)
            except queue.Empty:
                if self.process.is_alive():
                    continue
                msg = ("died",)
            except (EOFError, OSError):  # the pipe broke: the engine process is gone
                msg = ("died",)
            if msg[0] == "stopped":
                return
            try:
                if msg[0] == "died":
                    self._loop.call_soon_threadsafe(self._died)
                    return
                self._loop.call_soon_threadsafe(self._on_step, *msg[1:])
            except RuntimeError:  # the event loop is closed: nobody is waiting any more
                return
