"""Step inputs of the native runner (the native `atom_metadata_builder`): token ids, the core
AttentionMetadata and the rows to sample, built without waiting for the GPU.

Everything is written with numpy into two persistent host buffers (pinned on GPU) and reaches
two persistent device buffers with two non-blocking copies. Per step the buffers hold
  int64: [input_ids (T) | positions (T) | slot_mapping (T) | logits_indices (R)]
  int32: [seq_lens (S) | query_start_loc (S+1) | block_tables (S*W)]
For a CUDA-graph step of padded size G: T = S = G and W = the full table width, so the graph
captured for size G reads the same addresses on every replay. On CPU host and device buffers
are the same tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from atom_core.config import AtomConfig
from atom_core.forward_context import AttentionMetadata
from atom_frontends.native.request import Request
from atom_frontends.native.scheduler import Scheduled


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [R] int64: token row of each completing sequence's last token


def _tokens(r: Request, start: int, n: int) -> list[int]:
    """r.all_token_ids[start:start + n] without concatenating the whole history."""
    p = r.prompt_token_ids
    if start >= len(p):
        return r.output_token_ids[start - len(p) : start - len(p) + n]
    if start + n <= len(p):
        return p[start : start + n]
    return p[start:] + r.output_token_ids[: start + n - len(p)]


class InputBuilder:
    def __init__(self, config: AtomConfig, device: torch.device) -> None:
        self.block_size, self.max_model_len = config.block_size, config.max_model_len
        self.width = -(-config.max_model_len // config.block_size)  # blocks of the longest sequence
        seqs = config.max_num_seqs
        tokens = max(config.max_num_batched_tokens, seqs)
        sizes = {torch.int64: 3 * tokens + seqs, torch.int32: 2 * seqs + 1 + seqs * self.width}
        pin = device.type == "cuda"
        self.host = {dt: torch.zeros(n, dtype=dt, pin_memory=pin) for dt, n in sizes.items()}
        self.dev = {dt: torch.zeros(n, dtype=dt, device=device) for dt, n in sizes.items()} if pin else self.host
        self.np64, self.np32 = self.host[torch.int64].numpy(), self.host[torch.int32].numpy()
        # The pinned buffers are rewritten each step: wait until the last step's copies have read them.
        self.copied = torch.cuda.Event() if pin else None

    def build(self, batch: list[Scheduled], graph_size: int | None = None) -> StepInputs:
        """Inputs of one step; with graph_size, padded to that many one-token sequences."""
        if self.copied is not None:
            self.copied.synchronize()
        n = len(batch)
        q_lens = np.fromiter((s.num_new_tokens for s in batch), np.int64, n)
        starts = np.fromiter((s.request.num_computed_tokens for s in batch), np.int64, n)
        n_tok = int(q_lens.sum())
        s_, t_ = (graph_size, graph_size) if graph_size else (n, n_tok)
        w = self.width if graph_size else max(len(s.request.block_ids) for s in batch)
        ids, pos, slots = (self.np64[i * t_ : (i + 1) * t_] for i in range(3))
        seq_lens, qsl = self.np32[:s_], self.np32[s_ : 2 * s_ + 1]
        tables = self.np32[2 * s_ + 1 : 2 * s_ + 1 + s_ * w].reshape(s_, w)

        qsl[0] = 0
        np.cumsum(q_lens, out=qsl[1 : n + 1])
        seq_lens[:n] = starts + q_lens
        tables[:] = 0
        for i, s in enumerate(batch):
            tables[i, : len(s.request.block_ids)] = s.request.block_ids
        ids[:n_tok] = [t for s in batch for t in _tokens(s.request, s.request.num_computed_tokens, s.num_new_tokens)]
        seq_of = np.repeat(np.arange(n), q_lens)  # [n_tok] → owning sequence
        pos[:n_tok] = np.arange(n_tok) - qsl[seq_of] + starts[seq_of]
        slots[:n_tok] = tables[seq_of, pos[:n_tok] // self.block_size] * self.block_size + pos[:n_tok] % self.block_size
        # Padding rows (graph steps): one token each at position 0 writing nowhere (slot -1), attending
        # to one key of block 0, so kernels touch only valid memory and the rows are ignored.
        ids[n_tok:], pos[n_tok:], slots[n_tok:] = 0, 0, -1
        seq_lens[n:] = 1
        qsl[n + 1 :] = n_tok + np.arange(1, s_ - n + 1)

        rows = np.fromiter((i for i, s in enumerate(batch) if s.completes), np.int64)
        n_logits = len(rows)
        self.np64[3 * t_ : 3 * t_ + n_logits] = qsl[rows + 1] - 1
        self._copy(3 * t_ + n_logits, 2 * s_ + 1 + s_ * w)
        decodes = int((q_lens == 1).sum())
        hints = (1, self.max_model_len, s_, 0) if graph_size else (
            int(q_lens.max()), int(seq_lens[:n].max()), decodes, n - decodes)
        return self.views(s_, t_, w, n_logits, hints, n_tok - decodes)

    def _copy(self, n64: int, n32: int) -> None:
        if self.copied is None:
            return
        for dt, n in ((torch.int64, n64), (torch.int32, n32)):
            self.dev[dt][:n].copy_(self.host[dt][:n], non_blocking=True)
        self.copied.record()

    def views(self, s_: int, t_: int, w: int, n_logits: int, hints: tuple[int, int, int, int],
              num_prefill_tokens: int = 0) -> StepInputs:
        """Device views for S sequences, T tokens, table width W; hints = (max_query_len, max_seq_len,
        num_decodes, num_prefills) as the attention kernels size their grids with them."""
        d64, d32 = self.dev[torch.int64], self.dev[torch.int32]
        max_query_len, max_seq_len, num_decodes, num_prefills = hints
        md = AttentionMetadata(
            slot_mapping=d64[2 * t_ : 3 * t_],
            block_tables=d32[2 * s_ + 1 : 2 * s_ + 1 + s_ * w].view(s_, w),
            seq_lens=d32[:s_],
            query_start_loc=d32[s_ : 2 * s_ + 1],
            positions=d64[t_ : 2 * t_],
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            num_prefills=num_prefills,
            num_prefill_tokens=num_prefill_tokens,
            num_decodes=num_decodes,
            num_decode_tokens=num_decodes,
            block_size=self.block_size,
        )
        return StepInputs(d64[:t_], md, d64[3 * t_ : 3 * t_ + n_logits])
