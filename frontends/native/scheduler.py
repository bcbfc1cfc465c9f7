"""Continuous batching: decodes and (chunked) prefills share one token budget per step.

Running requests are served first, in arrival order; when the KV cache runs out, the most
recently admitted running request is preempted (its blocks are freed and it is recomputed
later, prefix cache permitting). Waiting requests are admitted while budget, sequence slots
and blocks remain.

With overlap scheduling a request's last sampled token may still be on the device (num_pending):
it is scheduled as the next input all the same (the runner reads it on the device), unless it
is the request's last by length, which the CPU knows without reading it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from atom_frontends.native.block_manager import BlockManager
from atom_frontends.native.request import Request, Status


@dataclass
class Scheduled:
    request: Request
    num_new_tokens: int
    # True when this chunk reaches the request's last token (one still on the device included), so a new
    # token gets sampled; fixed when scheduled, as the engine advances num_computed_tokens at launch.
    completes: bool = field(init=False)

    def __post_init__(self) -> None:
        r = self.request
        self.completes = r.num_computed_tokens + self.num_new_tokens == r.num_tokens + r.num_pending


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int) -> None:
        self.bm = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_model_len = max_model_len
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
            if self._ends_in_flight(req):
                i += 1
                continue
            n = min(req.num_tokens + req.num_pending - req.num_computed_tokens, budget)
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

    def _ends_in_flight(self, req: Request) -> bool:
        """The token on the device is the request's last by length (max_tokens or max_model_len): nothing more
        is computed for it (EOS and stops cannot be known before the token is read: that step is dropped)."""
        return req.num_pending > 0 and (len(req.output_token_ids) + req.num_pending >= req.params.max_tokens
                                        or req.num_tokens + req.num_pending >= self.max_model_len)

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
        """End a running or waiting request (waiting: not admitted yet, or preempted while its last token was
        still on the device) and free its blocks."""
        (self.running if req.status is Status.RUNNING else self.waiting).remove(req)
        req.status, req.finish_reason = Status.FINISHED, reason
        self.bm.free_request(req)
