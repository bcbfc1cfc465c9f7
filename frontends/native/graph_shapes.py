"""The shapes the native engine's CUDA graphs are captured for, and which one a scheduled step pads to.

A graph step has a fixed shape (tokens T, sequences S, sampled rows R): the InputBuilder pads a step's T' <= T real
tokens of S' <= S real sequences into it (inputs.py: padding tokens write nowhere, padding sequences own them), and
the graph computes logits for R rows, the completing sequences' last tokens first. Two families, one mechanism:
- decode shapes (G, G, G), G on batch_size_ladder: steps whose every sequence adds one token. S = G keeps the
  decode attention's split-KV parallelism of a small batch (its split count follows S).
- mixed shapes (T, min(T, M) + k, min(T, M)), T on token_ladder (M = max_num_seqs): any other step (prefills,
  chunks, prefills beside decodes). A step of T' <= T tokens has at most min(T, M) sequences; the k extra
  sequences exist to own the padding tokens, each padding sequence no longer than max_model_len (the block-table
  width), so k = ceil(T / max_model_len).
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

MIN_GRAPH_TOKENS = 16  # the smallest mixed shape: below it, one-token rows make a decode shape anyway


class GraphShape(NamedTuple):
    tokens: int  # T: token rows of the step
    seqs: int  # S: sequences (real first, then padding)
    rows: int  # R: logits / sampled rows (completing sequences first, then row 0 repeated)


def batch_size_ladder(max_size: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, ... (steps of 8), max_size."""
    sizes = {b for b in (1, 2, 4, 8) if b < max_size} | set(range(16, max_size, 8)) | {max_size}
    return sorted(sizes)


def token_ladder(max_tokens: int) -> list[int]:
    """16, 32, 64, ... (doubling) below max_tokens, then max_tokens (the scheduler's budget per step)."""
    sizes, t = [], MIN_GRAPH_TOKENS
    while t < max_tokens:
        sizes.append(t)
        t *= 2
    return [*sizes, max_tokens]


def decode_shape(size: int) -> GraphShape:
    return GraphShape(size, size, size)


def mixed_shape(tokens: int, max_num_seqs: int, max_model_len: int) -> GraphShape:
    rows = min(tokens, max_num_seqs)
    return GraphShape(tokens, rows + -(-tokens // max_model_len), rows)


def max_graph_seqs(max_num_seqs: int, max_tokens: int, max_model_len: int) -> int:
    """The most sequences any graph shape has (the InputBuilder sizes its buffers for it)."""
    return max(max_num_seqs, mixed_shape(max(max_tokens, max_num_seqs), max_num_seqs, max_model_len).seqs)


class ShapeLadder:
    """The captured shapes; pick() chooses a step's."""

    def __init__(self, decode_sizes: list[int], token_sizes: list[int], max_num_seqs: int, max_model_len: int):
        self.decode_sizes, self.token_sizes = sorted(decode_sizes), sorted(token_sizes)
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len

    @property
    def shapes(self) -> list[GraphShape]:
        return ([decode_shape(g) for g in self.decode_sizes]
                + [mixed_shape(t, self.max_num_seqs, self.max_model_len) for t in self.token_sizes])

    def pick(self, num_tokens: int, num_seqs: int) -> GraphShape | None:
        """The smallest shape that holds a step of num_tokens over num_seqs sequences: a decode shape when every
        sequence adds one token, else a mixed one; None when no captured shape holds it."""
        if num_tokens == num_seqs:
            size = _at_least(self.decode_sizes, num_seqs)
            if size is not None:
                return decode_shape(size)
        tokens = _at_least(self.token_sizes, num_tokens)
        if tokens is None:
            return None
        shape = mixed_shape(tokens, self.max_num_seqs, self.max_model_len)
        return shape if num_seqs <= shape.rows else None


def _at_least(sizes: list[int], n: int) -> int | None:
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None
