"""Per-step forward context and the ONE attention-metadata format every host's builder produces."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from atom_kernels.reference.mla import MLADecodeMetadata


@dataclass
class AttentionMetadata:
    """A batch of sequences, each contributing its new tokens; all tensors on the model's device.

    Tokens are laid out sequence after sequence; sequence i owns token rows
    query_start_loc[i]:query_start_loc[i+1], which are the LAST positions of its seq_lens[i] tokens.
    Builders make it with `from_query_lens`, which gives the counts below their one meaning.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: block * block_size + offset; -1 = padding
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32 (block ids in the host's KV cache)
    seq_lens: torch.Tensor  # [num_seqs] int32: context length incl. this step's tokens
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    positions: torch.Tensor  # [num_tokens] int64
    max_query_len: int
    max_seq_len: int  # the longest seq_lens entry, or an upper bound of it (a CUDA graph's capture)
    # Split by query length alone, as the attention kernels split a batch: a sequence with one new token (a
    # decode, or a one-token prefill chunk: the same maths) runs in the decode kernel, one with more in the
    # prefill kernel. Sequences with no new token (a host's padding requests) are neither.
    num_prefills: int  # sequences with more than one new token
    num_decodes: int  # sequences with exactly one new token
    # The step's MLA decode page indices when the host made them (in buffers it keeps, so a CUDA graph replay
    # reads this step's refill); None: the MLA kernels make them once a step in plan_cache.
    mla_decode: MLADecodeMetadata | None = None
    # Kernels' per-step memo (the torch reference's gather plan, the decode launch order, ...: made once and
    # shared by every layer; keys are private to the kernel that makes them). Valid for one step only: a host
    # that reuses a metadata object across steps clears it.
    plan_cache: dict[Any, Any] = field(default_factory=dict)

    @classmethod
    def from_query_lens(cls, query_lens: Sequence[int], *, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, query_start_loc: torch.Tensor, positions: torch.Tensor,
                        max_seq_len: int, mla_decode: MLADecodeMetadata | None = None) -> AttentionMetadata:
        """The metadata of a batch whose sequence i has query_lens[i] new tokens (CPU-side ints, one per
        seq_lens entry; 0 for a host's padding request): max_query_len and the prefill/decode counts follow
        from them. The tensors are taken as they are (views of the host's buffers, no copies)."""
        lens = query_lens if isinstance(query_lens, list) else list(query_lens)
        if len(lens) != seq_lens.shape[0]:
            raise ValueError(f"{len(lens)} query lengths for {seq_lens.shape[0]} sequences: pass one per sequence "
                             "(0 for a padding request)")
        decodes, empty = lens.count(1), lens.count(0)
        if lens and min(lens) < 0:
            raise ValueError(f"negative query length in {lens}: each is a sequence's number of new tokens")
        return cls(slot_mapping=slot_mapping, block_tables=block_tables, seq_lens=seq_lens,
                   query_start_loc=query_start_loc, positions=positions, max_query_len=max(lens, default=0),
                   max_seq_len=max_seq_len, num_prefills=len(lens) - decodes - empty, num_decodes=decodes,
                   mla_decode=mla_decode)

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]


@dataclass
class ForwardContext:
    attn_metadata: AttentionMetadata | dict[str, AttentionMetadata] | None
    extra: dict[str, Any] = field(default_factory=dict)

    def metadata_for(self, layer_name: str) -> AttentionMetadata | None:
        md = self.attn_metadata
        return md.get(layer_name) if isinstance(md, dict) else md


_context: ContextVar[ForwardContext | None] = ContextVar("atom_forward_context", default=None)


@contextlib.contextmanager
def set_forward_context(
    attn_metadata: AttentionMetadata | dict[str, AttentionMetadata] | None, **extra: Any
) -> Iterator[ForwardContext]:
    """Make `attn_metadata` visible to every attention layer for one forward; restores on exit."""
    ctx = ForwardContext(attn_metadata, extra)
    token = _context.set(ctx)
    try:
        yield ctx
    finally:
        _context.reset(token)


def get_forward_context() -> ForwardContext:
    ctx = _context.get()
    if ctx is None:
        raise RuntimeError("no forward context: run the model inside atom_core.forward_context.set_forward_context")
    return ctx
