"""The engine core of `atom-core serve`: its own process (as vLLM's and SGLang's servers run theirs), which
schedules and runs steps while the server process tokenizes, detokenizes and streams.

It runs an LLMEngine without a tokenizer: requests come in as token ids with checked SamplingParams, and once
per step only what is new goes out: per live request a Delta (each sample's new token ids and logprobs, its
finish reason), never the prompt or the tokens sent before, plus a snapshot of the engine's counters.

Commands in (tuples): ("add", request_id, token_ids, params), ("abort", request_id),
("stop_sample", request_id, index, stop_string), ("shutdown",).
Messages out: ("ready", info), ("failed", exception), ("step", [Delta], stats), ("stopped",).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import queue
import signal
import time
from dataclasses import dataclass, replace

import torch

from atom_frontends.native.engine import LLMEngine
from atom_frontends.native.engine_args import EngineArgs
from atom_frontends.native.request import CompletionOutput, PromptLogprobs, RequestOutput
from atom_kernels import envs

log = logging.getLogger(__name__)
IDLE_POLL_S = 1.0  # how often an idle engine process checks that its server still lives


@dataclass
class Delta:
    """What one step adds to one request: outputs hold only new token ids and logprobs (text "": the server
    detokenizes); error: the engine failed this request (it has ended)."""
    request_id: str
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int = 0
    error: str | None = None

    def __reduce__(self):  # pickled as its fields, in order: the server unpickles one per live request per step,
        return Delta, tuple(self.__dict__.values())  # ~6x faster than a dataclass's default state dict


def _delta(out: RequestOutput) -> Delta:
    return Delta(out.request_id, out.outputs, out.finished, out.prompt_logprobs, out.num_cached_tokens)


class EngineCore:
    """The engine side of the commands above, without the queues: handle() a command, step() for the deltas."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.live: set[str] = set()
        self.num_aborted = 0  # requests stopped early (client gone, shutdown)

    def info(self) -> dict:
        """What the server needs to check requests: the lengths may have been lowered to what the KV cache holds."""
        cfg = self.engine.config
        return {"max_model_len": cfg.max_model_len, "vocab_size": self.engine.vocab_size,
                "max_num_seqs": cfg.max_num_seqs, "pid": os.getpid(), "stats": self.stats()}

    def handle(self, command: tuple) -> list[Delta]:
        """Run one command; a request that cannot be added comes back as an error Delta (the others go on)."""
        kind, rid, *rest = command
        if kind == "add":
            try:
                self.engine.enqueue(None, rest[0], rest[1], rid, stream=True)
            except Exception as e:  # e.g. an id in use: this request fails, no other
                return [Delta(rid, [], True, error=f"the engine refused this request: {e}")]
            self.live.add(rid)
        elif kind == "abort" and rid in self.live and self.engine.abort(rid):
            self.num_aborted += 1  # its output ("abort") comes out of the next step
        elif kind == "stop_sample" and rid in self.live:
            self.engine.stop_sample(rid, *rest)
        return []

    def abort_all(self) -> None:
        for rid in list(self.live):
            self.handle(("abort", rid))

    def step(self) -> list[Delta]:
        """One engine step; a Delta for every live request with news. A failing step fails the requests in
        flight (their blocks are freed) and the engine goes on serving new ones."""
        eng = self.engine
        try:
            finished = {out.request_id: out for out in eng.step()} if eng.has_unfinished() else {}
        except Exception as e:
            log.exception("atom-core: an engine step failed; failing the %d requests in flight", len(self.live))
            for rid in self.live:
                eng.abort(rid)  # its "abort" output comes out of the next step, unclaimed
            failed = [Delta(rid, [], True, error=f"the engine failed while running this request: {e!r}")
                      for rid in self.live]
            self.live.clear()
            return failed
        deltas = []
        for rid in list(self.live):
            out = finished.get(rid)
            if out is None:
                if not eng.has_news(rid):  # e.g. one of the waiting requests, often half the live ones under load
                    continue
                out = eng.current_output(rid)
            if out.finished:
                self.live.discard(rid)
            if out.finished or out.prompt_logprobs is not None or any(c.token_ids for c in out.outputs):
                deltas.append(_delta(out))
        return deltas

    def stats(self) -> dict[str, int]:
        sched, bm = self.engine.scheduler, self.engine.block_manager
        return {"num_kv_blocks": bm.num_blocks, "num_free_kv_blocks": bm.num_free_blocks,
                "num_running_seqs": len(sched.running), "num_waiting_seqs": len(sched.waiting),
                "num_requests": len(self.live), "num_aborted_requests": self.num_aborted,
                "num_preemptions": sched.num_preemptions,
                "sent_at": time.monotonic()}  # the server's metrics tell how long the news waited for it


@contextlib.contextmanager
def frozen_heap():
    """Around serving, once started: what is loaded (modules, model, tokenizer) moves to the collector's permanent
    generation, so the collections that serving's garbage triggers stop walking it (the server process's cost per
    streamed token: 37 -> 26 us, CPU). vLLM's server and engine processes do the same. Unfrozen on the way out:
    objects left frozen are never freed, and nanobind (Triton) reports them as leaks at exit."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _picklable(e: Exception) -> Exception:
    try:
        pickle.dumps(e)
        return e
    except Exception:
        return RuntimeError(f"the engine failed to start: {type(e).__name__}: {e}")


def _commands(inbox, block: bool) -> list[tuple]:
    """Every command waiting now; when `block`, wait up to IDLE_POLL_S for the first."""
    out = []
    while True:
        try:
            out.append(inbox.get(block=block and not out, timeout=IDLE_POLL_S))
        except queue.Empty:
            return out


def run_engine_core(args: EngineArgs, inbox, outbox) -> None:
    """The engine process's main (multiprocessing, spawn): load the model, then step while work remains. It ends
    on ("shutdown",) (aborting what is left) or when its server process is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server stops us in order
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    logging.getLogger("atom_frontends").setLevel(logging.INFO)
    parent = os.getppid()
    if envs.OMP_NUM_THREADS is None:
        # One core is left to the server process (vLLM's CPU server reserves one too): torch's threads spin-wait
        # at each op's end, and one of them descheduled by the server's work stalls the whole step.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) - 1))
    try:
        core = EngineCore(LLMEngine(replace(args, skip_tokenizer_init=True)))
    except Exception as e:  # raised again in the server: a bad argument reads as the offline engine's
        outbox.put(("failed", _picklable(e)))
        return
    outbox.put(("ready", core.info()))
    with frozen_heap():
        while os.getppid() == parent:
            commands = _commands(inbox, block=not core.engine.has_unfinished())
            deltas = [d for c in commands if c[0] != "shutdown" for d in core.handle(c)]
            stopping = any(c[0] == "shutdown" for c in commands)
            if stopping:
                core.abort_all()
            if core.engine.has_unfinished():
                deltas += core.step()
            if deltas or commands:
                outbox.put(("step", deltas, core.stats()))
            if stopping:
                break
    outbox.put(("stopped",))
