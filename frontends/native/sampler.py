"""Sampling: penalties, greedy, temperature, min_p, top-k, top-p, per-request seeds, min_tokens masking,
and logprobs, in vLLM's order (raw logprobs → min_tokens → penalties → greedy | temperature → min_p →
top-k/top-p → draw).

Vectorised over the batch and free of device syncs: per-request values travel to the device in non-blocking
copies from pinned memory, and the sampled ids and logprobs stay on the device in a StepOutput, whose
results() is the step's one read. With overlap scheduling a request's previous token may not have been read
yet (Request.num_pending): min_tokens counts it and the penalties add it on the device.

A GPU decode step's CUDA graph samples on its own when graph_sample_suffices: the op sample_tokens (argmax, or
Gumbel-max with Philox noise keyed per row by graph_seeds) on its logits; then sample() does not run.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np
import torch

from atom_frontends.native.request import Request

# one position's logprobs as the sampler reads them: (token ids, logprobs, ranks), the chosen token first
LogprobRow = tuple[list[int], list[float], list[int]]


@dataclass
class SeqResult:
    token: int | None = None  # None: a partial prefill chunk, nothing sampled
    logprobs: LogprobRow | None = None
    prompt_logprobs: list[LogprobRow] | None = None


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A CPU list as a device tensor without waiting (pinned staging on GPU)."""
    t = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return t.to(device, non_blocking=True)


def _below_min_tokens(req: Request) -> bool:
    """Fewer than min_tokens outputs (the one still on the device counted): its EOS/stop tokens cannot be chosen."""
    return len(req.output_token_ids) + req.num_pending < req.params.min_tokens


def _mask_stop_tokens(logits: torch.Tensor, reqs: list[Request]) -> None:
    """Until a request has min_tokens outputs, its EOS/stop tokens cannot be chosen."""
    rows, cols = [], []
    for row, req in enumerate(reqs):
        if _below_min_tokens(req):
            ids = [t for t in req.stop_ids if t < logits.shape[1]]
            rows += [row] * len(ids)
            cols += ids
    if rows:
        index = to_device([rows, cols], torch.int64, logits.device)
        logits[index[0], index[1]] = float("-inf")


def _token_counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[N, V] occurrences of each token id in each row's list (one padded scatter, pad id = V)."""
    width = max(1, max(len(t) for t in token_lists))
    padded = to_device([t + [vocab] * (width - len(t)) for t in token_lists], torch.int64, device)
    counts = torch.zeros(len(token_lists), vocab + 1, dtype=torch.float32, device=device)
    return counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.float32))[:, :vocab]


def apply_penalties(logits: torch.Tensor, reqs: list[Request], last: torch.Tensor | None = None) -> torch.Tensor:
    """logits [N, V] float32 → penalized, as vLLM: repetition (HF's rule: divide positive logits, multiply
    negative ones) over prompt + output tokens, then frequency (per output occurrence) and presence
    (once per output token). last: the previous step's sampled tokens on the device, where the tokens of
    requests with num_pending are (row pending_row)."""
    vocab, dev = logits.shape[1], logits.device
    out_counts = _token_counts([r.output_token_ids for r in reqs], vocab, dev)
    pending = [(row, r.pending_row) for row, r in enumerate(reqs) if r.num_pending]
    if pending:  # the outputs the CPU has not read yet count too, added on the device
        rows, src = to_device(list(zip(*pending)), torch.int64, dev)
        out_counts.index_put_((rows, last[src]), torch.ones(len(pending), device=dev), accumulate=True)
    seen = _token_counts([r.prompt_token_ids for r in reqs], vocab, dev).bool() | out_counts.bool()
    rep, freq, pres = to_device([[r.params.repetition_penalty for r in reqs],
                                  [r.params.frequency_penalty for r in reqs],
                                  [r.params.presence_penalty for r in reqs]], torch.float32, dev)
    rep = torch.where(seen, rep.unsqueeze(1), 1.0)
    logits = torch.where(logits > 0, logits / rep, logits * rep)
    return logits - freq.unsqueeze(1) * out_counts - pres.unsqueeze(1) * out_counts.bool()


def _min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p [N] times the row's largest (0 = off)."""
    probs = logits.softmax(dim=-1)
    keep = probs >= min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(~keep, float("-inf"))


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [N, V]; top_k [N] (V = off); top_p [N] (1 = off)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[1], device=logits.device).expand_as(sorted_logits)
    drop = ranks >= top_k.unsqueeze(1)
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # drop a token when the tokens ranked above it already cover top_p
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p.unsqueeze(1)
    drop[:, 0] = False
    return logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))


def _draw(probs: torch.Tensor, reqs: list[Request], generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs [N, V]. Exponential race: argmax(p / E) with E ~ Exp(1) draws from p."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    for row, req in enumerate(reqs):
        if req.generator is not None:  # seeded requests draw from their own stream
            noise[row].exponential_(generator=req.generator)
    return (probs / noise).argmax(dim=-1)


def _random(logits: torch.Tensor, reqs: list[Request], generator: torch.Generator | None) -> torch.Tensor:
    """[N] tokens drawn after temperature, min_p and top-k/top-p (greedy rows get their argmax later)."""
    vocab, dev = logits.shape[1], logits.device
    params = to_device([[r.params.temperature or 1.0 for r in reqs],
                         [r.params.top_k if r.params.top_k > 0 else vocab for r in reqs],
                         [r.params.top_p for r in reqs],
                         [r.params.min_p for r in reqs]], torch.float32, dev)
    temps, top_k, top_p, min_p = params
    scaled = logits.float() / temps.unsqueeze(1)
    if any(r.params.min_p > 0 for r in reqs):
        scaled = _min_p(scaled, min_p)
    if any(r.params.top_k > 0 or r.params.top_p < 1 for r in reqs):  # the sort is costly: only when asked
        scaled = _top_k_top_p(scaled, top_k, top_p)
    return _draw(scaled.softmax(dim=-1), reqs, generator)


def top_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor, n: int) -> torch.Tensor:
    """logprobs [N, V], chosen [N] → [3, N, n + 1] float64 on the device: per row the ids, logprobs and ranks of
    the chosen token with its rank (as vLLM: the tokens at least as likely, itself included), then of the n most
    likely with ranks 1..n. Ids and ranks travel as float64 with the logprobs (exact below 2**53): one read."""
    lp_chosen = logprobs.gather(1, chosen.unsqueeze(1))
    rank = (logprobs >= lp_chosen).sum(dim=-1, keepdim=True)
    top_lp, top_ids = logprobs.topk(n, dim=-1)
    top_ranks = torch.arange(1, n + 1, device=rank.device).expand(len(rank), n)
    return torch.stack([torch.cat([chosen.unsqueeze(1), top_ids], dim=1).double(),
                        torch.cat([lp_chosen, top_lp], dim=1).double(),
                        torch.cat([rank, top_ranks], dim=1).double()])


def logprob_rows(table: list) -> list[LogprobRow]:
    """top_logprobs' [3, N, k] as CPU lists → per row (ids, logprobs, ranks)."""
    return [([int(t) for t in i], lp, [int(r) for r in rk]) for i, lp, rk in zip(*table)]


@dataclass
class Sampled:
    """One step's sampling, on the device."""
    tokens: torch.Tensor  # [N] int64, one per row of logits
    logprobs: torch.Tensor | None = None  # [3, L, k + 1] (top_logprobs) of the L rows asking, in row order


def graph_sample_suffices(reqs: list[Request]) -> bool:
    """True when sample_tokens on the raw logits (argmax at temperature 0, a draw from softmax(logits / t) else)
    gives every request its token now: greedy or plain temperature sampling (no top-k, top-p, min-p), no
    penalties, no logprobs, no stop token masked for min_tokens (what sample() would do to them), and no
    per-request seed (its own generator's stream must not depend on which steps ran as graphs)."""
    return all(_plain(r) and not r.params.penalized and r.params.logprobs is None
               and not (_below_min_tokens(r) and r.stop_ids) for r in reqs)


def _plain(req: Request) -> bool:
    p = req.params
    return p.greedy or (p.top_k <= 0 and p.top_p == 1 and p.min_p == 0 and req.generator is None)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """uint64 → uint64 (SplitMix64's finaliser, wrapping arithmetic): consecutive inputs, unrelated outputs."""
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


def seed_base(seed: int | None) -> int:
    """The base of an engine's graph_seeds: from its seed (None: from the OS's entropy)."""
    start = secrets.randbits(64) if seed is None else seed % 2**64
    return int(_splitmix64(np.array([start], dtype=np.uint64))[0])


def graph_seeds(base: int, first: int, n: int) -> np.ndarray:
    """[n] int64 Philox keys of the engine's graph-sampled rows first .. first + n - 1 (a running count): every
    row of every step its own stream, and the same engine seed with the same schedule the same keys."""
    index = np.arange(first, first + n, dtype=np.uint64) + np.uint64(base)
    return _splitmix64(index).view(np.int64)


def sample(logits: torch.Tensor, reqs: list[Request], generator: torch.Generator | None,
           last: torch.Tensor | None = None) -> Sampled:
    """logits [N, V] (one row per request) → one token (and the logprobs asked for) per request, on the device.
    last: the previous step's sampled tokens (apply_penalties)."""
    want = [r.params.logprobs for r in reqs if r.params.logprobs is not None]
    raw = logits.float().log_softmax(dim=-1) if want else None  # vLLM's default: of the raw logits
    _mask_stop_tokens(logits, reqs)
    if any(r.params.penalized for r in reqs):
        logits = apply_penalties(logits.float(), reqs, last)
    tokens = logits.argmax(dim=-1)  # argmax is exact in any float dtype
    if not all(r.params.greedy for r in reqs):
        is_greedy = to_device([r.params.greedy for r in reqs], torch.bool, logits.device)
        tokens = torch.where(is_greedy, tokens, _random(logits, reqs, generator))
    if not want:
        return Sampled(tokens)
    index = to_device([i for i, r in enumerate(reqs) if r.params.logprobs is not None], torch.int64, logits.device)
    return Sampled(tokens, top_logprobs(raw[index], tokens[index], max(want)))


class StepOutput:
    """A launched step's results on the device: the sampled tokens of its completing rows, their logprobs, prompt
    logprobs. Their copies to the CPU start at once (non-blocking, into pinned memory on GPU); results() waits
    for those copies only, not for later steps."""

    def __init__(self, reqs: list[Request], rows: list[int], sampled: Sampled | None,
                 prompt: dict[int, torch.Tensor]) -> None:
        """reqs: the batch's requests; rows: the batch indices that sampled (rows of sampled.tokens);
        prompt: batch index → its top_logprobs table of prompt logprobs."""
        self.num_seqs, self.rows, self.prompt_keys, self.sampled = len(reqs), rows, list(prompt), sampled is not None
        self.logprob_sizes = [] if sampled is None else [(i, reqs[i].params.logprobs) for i in rows
                                                         if reqs[i].params.logprobs is not None]
        tensors = [] if sampled is None else [t for t in (sampled.tokens, sampled.logprobs) if t is not None]
        tensors += prompt.values()
        # on CPU a copy too: a tensor may be a view of a buffer the next step rewrites (the runner's tokens)
        self._cpu = [t.to("cpu", non_blocking=True) if t.is_cuda else t.clone() for t in tensors]
        self._copied = None
        if tensors and tensors[0].is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()

    def results(self) -> list[SeqResult]:
        """One SeqResult per sequence of the batch: the step's one wait for the device."""
        if self._copied is not None:
            self._copied.synchronize()
        out = [SeqResult() for _ in range(self.num_seqs)]
        cpu = iter(self._cpu)
        if self.sampled:
            for i, t in zip(self.rows, next(cpu).tolist()):
                out[i].token = t
            if self.logprob_sizes:
                for (i, n), (ids, lps, ranks) in zip(self.logprob_sizes, logprob_rows(next(cpu).tolist())):
                    out[i].logprobs = (ids[: n + 1], lps[: n + 1], ranks[: n + 1])
        for i in self.prompt_keys:
            out[i].prompt_logprobs = logprob_rows(next(cpu).tolist())
        return out
