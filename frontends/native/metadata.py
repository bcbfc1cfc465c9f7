"""Native batch → the core's AttentionMetadata (the native `atom_metadata_builder`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.forward_context import AttentionMetadata


@dataclass
class SeqChunk:
    """One sequence's share of a step: tokens [start, start + num_new) computed against block_ids."""

    block_ids: list[int]
    start: int
    num_new: int


def build_metadata(chunks: list[SeqChunk], block_size: int, device: torch.device) -> AttentionMetadata:
    positions: list[int] = []
    slots: list[int] = []
    seq_lens: list[int] = []
    qsl = [0]
    for c in chunks:
        end = c.start + c.num_new
        pos = range(c.start, end)
        positions.extend(pos)
        slots.extend(c.block_ids[p // block_size] * block_size + p % block_size for p in pos)
        seq_lens.append(end)
        qsl.append(qsl[-1] + c.num_new)
    max_blocks = max(len(c.block_ids) for c in chunks)
    tables = [c.block_ids + [0] * (max_blocks - len(c.block_ids)) for c in chunks]
    q_lens = [c.num_new for c in chunks]
    decodes = [n for n in q_lens if n == 1]

    def t(x, dtype):
        return torch.tensor(x, dtype=dtype).to(device, non_blocking=True)

    return AttentionMetadata(
        slot_mapping=t(slots, torch.int64),
        block_tables=t(tables, torch.int32),
        seq_lens=t(seq_lens, torch.int32),
        query_start_loc=t(qsl, torch.int32),
        positions=t(positions, torch.int64),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        num_prefills=len(q_lens) - len(decodes),
        num_prefill_tokens=sum(q_lens) - len(decodes),
        num_decodes=len(decodes),
        num_decode_tokens=len(decodes),
        block_size=block_size,
    )
