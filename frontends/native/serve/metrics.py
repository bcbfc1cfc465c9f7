"""What `atom-core serve` reports: Prometheus figures at GET /metrics, named as vLLM's server names them
(vllm/v1/metrics/loggers.py) under our prefix `atom_core:`, and one log line per request when asked
(--enable-log-requests). Both watch AsyncLLMEngine (its observers) on the event loop; times are when the
engine's news reaches the server process, i.e. what a client sees, less the network."""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from atom_frontends.native.output_processor import RequestState
from atom_frontends.native.request import RequestOutput

log = logging.getLogger(__name__)
PREFIX = "atom_core:"
# vLLM's buckets (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
OUTPUT_DELAY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class Metrics:
    """The figures of one server, in their own registry (several servers in one process do not collide)."""

    def __init__(self, model_name: str) -> None:
        self.registry = r = CollectorRegistry()
        m, labels = {"registry": r, "labelnames": ["model_name"]}, [model_name]

        def made(cls, name: str, doc: str, **kw):
            return cls(PREFIX + name, doc, **m, **kw).labels(*labels)

        self.running = made(Gauge, "num_requests_running", "Sequences in the engine's running batch.")
        self.waiting = made(Gauge, "num_requests_waiting", "Sequences waiting to be scheduled.")
        self.kv_usage = made(Gauge, "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).")
        self.preemptions = made(Counter, "num_preemptions", "Sequences preempted (their KV blocks freed).")
        self.prompt_tokens = made(Counter, "prompt_tokens", "Prompt tokens of requests that produced a token.")
        self.generation_tokens = made(Counter, "generation_tokens", "Tokens generated.")
        self.ttft = made(Histogram, "time_to_first_token_seconds", "Request arrival to first token.",
                         buckets=TTFT_BUCKETS)
        self.itl = made(Histogram, "inter_token_latency_seconds", "Time between a request's tokens.",
                        buckets=ITL_BUCKETS)
        self.e2e = made(Histogram, "e2e_request_latency_seconds", "Request arrival to its end.", buckets=E2E_BUCKETS)
        self.request_prompt = made(Histogram, "request_prompt_tokens", "Prompt tokens per finished request.",
                                   buckets=TOKEN_BUCKETS)
        self.request_generation = made(Histogram, "request_generation_tokens",
                                       "Generated tokens per finished request.", buckets=TOKEN_BUCKETS)
        self.output_delay = made(Histogram, "engine_output_delay_seconds", "From the end of an engine step to its "
                                 "news handled in the server process (a server that falls behind its engine: "
                                 "its news wait in the queue between them).", buckets=OUTPUT_DELAY_BUCKETS)
        self.success = Counter(PREFIX + "request_success", "Finished requests, by finish reason.",
                               ["model_name", "finished_reason"], registry=r)
        self.model_name, self._preemptions = model_name, 0

    def on_add(self, state: RequestState) -> None:
        pass

    def on_stats(self, stats: dict) -> None:
        self.running.set(stats["num_running_seqs"])
        self.waiting.set(stats["num_waiting_seqs"])
        self.kv_usage.set(1 - stats["num_free_kv_blocks"] / max(stats["num_kv_blocks"], 1))
        self.preemptions.inc(stats["num_preemptions"] - self._preemptions)
        self._preemptions = stats["num_preemptions"]
        self.output_delay.observe(time.monotonic() - stats["sent_at"])  # one system-wide clock on Linux and macOS

    def on_output(self, state: RequestState, out: RequestOutput | BaseException, now: float) -> None:
        new = 0 if isinstance(out, BaseException) else sum(len(c.token_ids) for c in out.outputs)
        if new:
            if state.last_token_at is None:
                self.ttft.observe(now - state.arrival)
                self.prompt_tokens.inc(len(state.prompt_token_ids))
            else:
                for _ in range(new):  # tokens that came together share the interval
                    self.itl.observe((now - state.last_token_at) / new)
            state.last_token_at = now
            self.generation_tokens.inc(new)
        if isinstance(out, BaseException) or out.finished:
            reasons = [] if isinstance(out, BaseException) else [c.finish_reason for c in out.outputs]
            self.success.labels(self.model_name, next((r for r in reasons if r), "error")).inc()
            self.e2e.observe(now - state.arrival)
            self.request_prompt.observe(len(state.prompt_token_ids))
            self.request_generation.observe(state.num_output_tokens)


class RequestLog:
    """One INFO line when a request arrives and one when it ends (vLLM's --enable-log-requests)."""

    def on_add(self, state: RequestState) -> None:
        log.info("atom-core: request %s: %d prompt tokens, %s", state.request_id, len(state.prompt_token_ids),
                 state.params)

    def on_stats(self, stats: dict) -> None:
        pass

    def on_output(self, state: RequestState, out: RequestOutput | BaseException, now: float) -> None:
        if isinstance(out, BaseException):
            log.info("atom-core: request %s failed: %s", state.request_id, out)
        elif out.finished:
            reasons = [c.finish_reason for c in out.outputs]
            log.info("atom-core: request %s finished (%s): %d tokens in %.3f s", state.request_id,
                     ", ".join(r for r in reasons if r), state.num_output_tokens, now - state.arrival)
