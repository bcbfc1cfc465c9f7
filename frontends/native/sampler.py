"""Sampling: greedy, temperature, top-k, top-p, per-request seeds, min_tokens masking."""

from __future__ import annotations

import torch

from atom_frontends.native.request import Request


def _mask_stop_tokens(logits: torch.Tensor, reqs: list[Request]) -> None:
    """Until a request has min_tokens outputs, its EOS/stop tokens cannot be chosen."""
    for row, req in enumerate(reqs):
        if len(req.output_token_ids) < req.params.min_tokens:
            ids = [t for t in req.stop_ids if t < logits.shape[1]]
            if ids:
                logits[row, ids] = float("-inf")


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


def sample(logits: torch.Tensor, reqs: list[Request], generator: torch.Generator | None) -> list[int]:
    """logits [N, V] (one row per request) → one token id per request."""
    logits = logits.float()
    _mask_stop_tokens(logits, reqs)
    greedy = logits.argmax(dim=-1)
    if all(r.params.greedy for r in reqs):
        return greedy.tolist()
    vocab = logits.shape[1]
    temps = torch.tensor([r.params.temperature or 1.0 for r in reqs], device=logits.device)
    top_k = torch.tensor([r.params.top_k if r.params.top_k > 0 else vocab for r in reqs], device=logits.device)
    top_p = torch.tensor([r.params.top_p for r in reqs], device=logits.device)
    probs = _top_k_top_p(logits / temps.unsqueeze(1), top_k, top_p).softmax(dim=-1)
    # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p.
    noise = torch.empty_like(probs)
    for row, req in enumerate(reqs):
        noise[row].exponential_(generator=req.generator or generator)
    sampled = (probs / noise).argmax(dim=-1)
    is_greedy = torch.tensor([r.params.greedy for r in reqs], device=logits.device)
    return torch.where(is_greedy, greedy, sampled).tolist()
