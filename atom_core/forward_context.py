"""Per-step forward context and the ONE attention-metadata format every host's builder produces."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    """A batch of sequences, each contributing its new tokens; all tensors on the model's device.

    Tokens are laid out sequence after sequence; sequence i owns token rows
    query_start_loc[i]:query_start_loc[i+1], which are the LAST positions of its seq_lens[i] tokens.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: block * block_size + offset; -1 = padding
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32 (block ids in the host's KV cache)
    seq_lens: torch.Tensor  # [num_seqs] int32: context length incl. this step's tokens
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    positions: torch.Tensor  # [num_tokens] int64
    max_query_len: int
    max_seq_len: int
    num_prefills: int  # sequences with more than one new token (or a first chunk)
    num_decodes: int  # sequences with exactly one new token
    block_size: int
    # Kernels' per-step memo (e.g. the torch reference's gather plan, made once and shared by every
    # layer). Valid for one step only: a host that reuses a metadata object across steps clears it.
    scratch: dict[Any, Any] = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

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
