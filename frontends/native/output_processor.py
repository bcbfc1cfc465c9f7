"""The server-side half of a request `atom-core serve` runs (vLLM's output processor): the engine process sends
each sample's new token ids; here they become text (incrementally, Detokenizer), stop strings end a sample
(the engine is then told to stop it), and log-probabilities get their tokens' text.

The rules are the offline engine's (LLMEngine._check_stop): an EOS or stop token's text stays out unless
include_stop_str_in_output; stop strings are searched only past min_tokens and win over a length finish at
the same token; the text is cut at the stop string."""

from __future__ import annotations

import time

from atom_frontends.native.detokenizer import Detokenizer
from atom_frontends.native.engine_core import Delta
from atom_frontends.native.request import CompletionOutput, RequestOutput, SampleLogprobs
from atom_frontends.native.sampling_params import SamplingParams


class _Sample:
    def __init__(self, tokenizer, params: SamplingParams) -> None:
        self.detok = Detokenizer(tokenizer, params.stop, params.include_stop_str_in_output, incremental=True) \
            if tokenizer is not None else None
        self.num_tokens = 0
        self.ended = False


class RequestState:
    """One request's text so far, per sample. update(delta) → (the RequestOutput the stream takes: new tokens,
    the text so far; [(sample index, stop string)] samples that just hit a stop string)."""

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
                 tokenizer) -> None:
        self.request_id, self.prompt, self.prompt_token_ids = request_id, prompt, prompt_token_ids
        self.params, self.tokenizer = params, tokenizer
        self.samples = [_Sample(tokenizer, params) for _ in range(params.n)]
        self.num_output_tokens = 0  # all samples, what the client gets
        self.arrival = time.monotonic()
        self.last_token_at: float | None = None  # when the last tokens reached the server (metrics)

    def update(self, delta: Delta) -> tuple[RequestOutput, list[tuple[int, str]]]:
        outs, stops = [], []
        for c in delta.outputs:
            s = self.samples[c.index]
            if s.ended:
                continue  # cut at a stop string already: what the engine made meanwhile is dropped
            out = self._sample(s, c)
            s.ended = out.finish_reason is not None
            if isinstance(out.stop_reason, str):
                stops.append((c.index, out.stop_reason))
            self.num_output_tokens += len(out.token_ids)
            outs.append(out)
        finished = delta.finished or all(s.ended for s in self.samples)
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, self._decoded(delta.prompt_logprobs),
                             outs, finished, delta.num_cached_tokens), stops

    def _sample(self, s: _Sample, c: CompletionOutput) -> CompletionOutput:
        """c with the sample's text so far; cut at the first stop string among its new tokens."""
        p, ids, reason, stop_reason = self.params, c.token_ids, c.finish_reason, c.stop_reason
        for j, tok in enumerate(ids):
            s.num_tokens += 1
            if s.detok is None:
                continue
            last = j == len(ids) - 1
            if last and reason == "stop":  # an EOS or stop token
                if p.include_stop_str_in_output:
                    s.detok.add(tok, check_stop=False)
                break
            found = s.detok.add(tok, s.num_tokens > p.min_tokens)
            if found is not None:
                ids, reason, stop_reason = ids[: j + 1], "stop", found
                break
        if s.detok is not None and reason is not None and not isinstance(stop_reason, str):
            s.detok.finish()
        logprobs = None if c.logprobs is None else self._decoded(c.logprobs[: len(ids)])
        # constructed, not dataclasses.replace: this runs once per streamed token (replace costs ~3x as much)
        return CompletionOutput(c.index, s.detok.text if s.detok is not None else "", ids, c.cumulative_logprob,
                                logprobs, reason, stop_reason)

    def _decoded(self, rows: SampleLogprobs | None) -> SampleLogprobs | None:
        """Each token of the log-probabilities decoded on its own, as vLLM shows them."""
        if rows is None or self.tokenizer is None:
            return rows
        for row in rows:
            for t, lp in (row or {}).items():
                lp.decoded_token = self.tokenizer.decode([t])
        return rows
