"""Paged KV block allocation with prefix caching.

A block holds `block_size` consecutive tokens of one sequence. Full, computed blocks are
registered under a hash chained over all earlier tokens (blake2b of the parent hash + the
block's token ids), so another request with the same prefix reuses them. Blocks with no
users stay cached in an LRU free list until their slot is needed for new data.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from atom_frontends.native.request import Request


def block_hash(parent: bytes | None, tokens: list[int]) -> bytes:
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(array("q", tokens).tobytes())
    return h.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.hashes: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # hash → block id
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # LRU first

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, req: Request) -> int:
        """Attach cached blocks for the longest cached prefix; return its length in tokens.

        At least one token is left uncached, because the step must compute something to sample.
        """
        if req.block_ids:  # forked from sample 0 of its request
            return len(req.block_ids) * self.block_size
        if not self.enable_prefix_caching or req.params.prompt_logprobs is not None:
            return 0  # prompt logprobs need every prompt position's logits (vLLM's rule too)
        tokens, bs = req.all_token_ids, self.block_size
        parent = None
        for j in range((len(tokens) - 1) // bs):
            h = block_hash(parent, tokens[j * bs : (j + 1) * bs])
            bid = self.cached.get(h)
            if bid is None:
                break
            self._take(bid)
            req.block_ids.append(bid)
            req.block_hashes.append(h)
            parent = h
        return len(req.block_ids) * bs

    def fork(self, parent: Request, child: Request) -> int:
        """Share the parent's full prompt blocks with a new sample of the same prompt (ref counts + 1);
        return the tokens they hold. At least one prompt token is left for the child to compute, so it
        samples its own first token; the partial last block is not shared, as both would write to it."""
        k = (len(parent.prompt_token_ids) - 1) // self.block_size
        for bid in parent.block_ids[:k]:
            self._take(bid)
        child.block_ids = parent.block_ids[:k]
        child.block_hashes = parent.block_hashes[:k]
        return k * self.block_size

    def allocate(self, req: Request, num_tokens: int) -> bool:
        """Give `req` enough blocks for `num_tokens` tokens; False (and no change) if not enough are free."""
        need = self.blocks_needed(num_tokens) - len(req.block_ids)
        if need > len(self.free):
            return False
        for _ in range(max(need, 0)):
            bid, _ = self.free.popitem(last=False)
            h = self.hashes[bid]
            if h is not None:  # evict its cached content
                if self.cached.get(h) == bid:
                    del self.cached[h]
                self.hashes[bid] = None
            self.ref_counts[bid] = 1
            req.block_ids.append(bid)
        return True

    def cache_full_blocks(self, req: Request) -> None:
        """Register every block of `req` that is now full and computed. With overlap scheduling the positions of
        tokens still on the device (num_pending) are not: the step computing them may be dropped (the request
        ends at the token before) and their ids are not known yet."""
        bs = self.block_size
        full = (req.num_computed_tokens - req.num_pending) // bs
        if not self.enable_prefix_caching or len(req.block_hashes) >= full:
            return  # nothing newly full: skip building the token list (this runs every step)
        tokens = req.all_token_ids
        for j in range(len(req.block_hashes), full):
            parent = req.block_hashes[-1] if req.block_hashes else None
            h = block_hash(parent, tokens[j * bs : (j + 1) * bs])
            req.block_hashes.append(h)
            bid = req.block_ids[j]
            if h not in self.cached and self.hashes[bid] is None:
                self.cached[h] = bid
                self.hashes[bid] = h

    def free_request(self, req: Request) -> None:
        """Drop `req`'s references. Tail blocks go back first, so shared prefixes are evicted last."""
        for bid in reversed(req.block_ids):
            self.ref_counts[bid] -= 1
            if self.ref_counts[bid] == 0:
                self.free[bid] = None
                if self.hashes[bid] is None:  # nothing worth keeping: reuse it first
                    self.free.move_to_end(bid, last=False)
        req.block_ids, req.block_hashes = [], []

    def _take(self, bid: int) -> None:
        if self.ref_counts[bid] == 0:
            del self.free[bid]
        self.ref_counts[bid] += 1
