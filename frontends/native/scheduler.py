"""Continuous batching: decodes and (chunked) prefills share one token budget per step.

Running requests are served first, in arrival order; when the KV cache runs out, the most
recently admitted running request is preempted (its blocks are freed and it is recomputed
later, prefix cache permitting). Waiting requests are admitted while budget, sequence slots
and blocks remain.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from atom_frontends.native.block_manager import BlockManager
from atom_frontends.native.request import Request, Status


@dataclass
class Scheduled:
    request: Request
    num_new_tokens: int

    @property
    def completes(self) -> bool:
        """True when this chunk reaches the request's last token, so a new token gets sampled."""
        r = self.request
        return r.num_computed_tokens + self.num_new_tokens == r.num_tokens


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.bm = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Scheduled]:
        budget = self.max_num_batched_tokens
        out: list[Scheduled] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.bm.allocate(req, req.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                out.append(Scheduled(req, n))
                budget -= n
                i += 1
                continue
            break
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if self._awaits_fork(req):
                break
            cached = self.bm.match_prefix(req)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = cached
            req.num_computed_tokens = cached
            n = min(req.num_tokens - cached, budget)
            if not self.bm.allocate(req, cached + n):
                self.bm.free_request(req)
                req.num_computed_tokens = 0
                break
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            out.append(Scheduled(req, n))
            budget -= n
        return out

    def _awaits_fork(self, req: Request) -> bool:
        """Sample i > 0 of a request waits for sample 0's prefill, then shares its prompt blocks (the fork,
        not the prefix cache: it works with caching off and cannot lose the blocks to eviction). If
        sample 0 is no longer running (finished, preempted), the sample is computed as any request."""
        parent = req.fork_parent
        if parent is None or req.block_ids:
            return False
        if parent.status is Status.RUNNING and parent.num_computed_tokens < len(parent.prompt_token_ids):
            return True
        if parent.status is Status.RUNNING:
            req.num_cached_tokens = self.bm.fork(parent, req)
        req.fork_parent = None
        return False

    def _preempt(self, req: Request) -> None:
        self.bm.free_request(req)
        req.num_computed_tokens = 0
        req.status = Status.WAITING
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    def finish(self, req: Request, reason: str) -> None:
        req.status, req.finish_reason = Status.FINISHED, reason
        self.running.remove(req)
        self.bm.free_request(req)
