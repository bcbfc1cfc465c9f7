"""Step inputs of the native runner (the native `atom_metadata_builder`): token ids, the core
AttentionMetadata and the rows to sample, built without waiting for the GPU.

Everything is written with numpy into two persistent CPU buffers (pinned on GPU) and reaches
two persistent device buffers with two non-blocking copies. Per step the buffers hold
  int64: [input_ids (T) | positions (T) | slot_mapping (T) | logits_indices (R)]
  int32: [seq_lens (S) | query_start_loc (S+1) | block_tables (S*W)]
For a CUDA-graph step of shape (T, S, R) (graph_shapes.py) W = the full table width, so the graph captured for
that shape reads the same addresses on every replay, and the graph's sampling inputs follow
  int64: [... | logits_indices (R) | seeds (R)]  (Philox keys of sample_tokens)
  int32: [... | block_tables (S*W) | temperature (R, float32 bits)]  (0: argmax; padding rows 0)
Padding of a graph step (pad_graph_step): the T - T' padding tokens (after the real ones) have token 0, position 0
and slot PAD_SLOT (-1: the KV writes skip them); the S - S' padding sequences own them, spread evenly (each owns
its tokens as a whole context: seq_len = its token count, table row of block 0, so attention reads only block 0,
finite, and never more than max_model_len keys); a padding sequence may own none. Padding logits rows read row 0.
On CPU the CPU and device buffers are the same tensors.

MLA models (a config with kv_lora_rank) also get the MLA decode metadata (kv_indptr, kv_indices: see
atom_kernels.reference.mla) once per step, on the device, into the metadata's mla_decode where the MLA kernels
find it. With AtomConfig.persistent_mla_decode_metadata (default on) it is refilled in place in buffers sized
here (the most sequences of any graph shape x the full table width), the same addresses on every step, so a graph
replay reads the refill this step made; off, the kernels make it afresh each step (inside a captured graph, on
replay). Its positions are the metadata's own (no copy); max_query_len is the maximum over all sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from atom_core.config import AtomConfig
from atom_core.forward_context import AttentionMetadata
from atom_frontends.native.graph_shapes import GraphShape, max_graph_seqs
from atom_frontends.native.request import Request
from atom_frontends.native.scheduler import Scheduled
from atom_kernels.reference.mla import mla_decode_buffers, mla_decode_metadata

PAD_SLOT = -1  # slot_mapping of padding tokens: the KV-cache writes skip negative slots


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [R] int64: token row of each completing sequence's last token (graphs: then 0s)
    temperature: torch.Tensor | None = None  # graph steps: [G] float32, each row's sample_tokens temperature
    seeds: torch.Tensor | None = None  # graph steps: [G] int64, each row's Philox key


def _tokens(r: Request, start: int, n: int) -> list[int]:
    """r.all_token_ids[start:start + n] without concatenating the whole history. A token still on the device
    (overlap scheduling: always the only new token of its sequence) is written as -1 - r.pending_row, which
    the runner replaces with row pending_row of the previous step's sampled tokens."""
    p = r.prompt_token_ids
    if start >= len(p):
        if r.num_pending:
            return [-1 - r.pending_row]
        return r.output_token_ids[start - len(p) : start - len(p) + n]
    if start + n <= len(p):
        return p[start : start + n]
    return p[start:] + r.output_token_ids[: start + n - len(p)]


def pad_lengths(num_tokens: int, num_seqs: int) -> np.ndarray:
    """[num_seqs] tokens of each padding sequence: num_tokens spread evenly (they differ by at most one)."""
    if num_seqs == 0 and num_tokens:
        raise ValueError(f"{num_tokens} padding tokens and no padding sequence to own them")
    q = np.full(num_seqs, num_tokens // max(num_seqs, 1), dtype=np.int64)
    q[: num_tokens - q.sum()] += 1
    return q


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def _fill_tables(tables: np.ndarray, block_ids: list[list[int]]) -> None:
    """tables [S, W] ← each sequence's block ids, zero-padded (one scatter instead of a row loop)."""
    tables[:] = 0
    lens = np.array([len(b) for b in block_ids], dtype=np.int64)
    if not len(lens):
        return
    starts = np.cumsum(lens) - lens
    rows = np.repeat(np.arange(len(lens)), lens)
    tables[rows, np.arange(len(rows)) - starts[rows]] = list(chain.from_iterable(block_ids))


class InputBuilder:
    def __init__(self, config: AtomConfig, device: torch.device) -> None:
        self.block_size, self.max_model_len = config.block_size, config.max_model_len
        # Block-table widths are multiples of 16: Triton specialises integer arguments (the table's row
        # stride) on divisibility by 16, so one width class means no recompiles as sequences grow.
        self.width = _round16(-(-config.max_model_len // config.block_size))  # >= blocks of the longest sequence
        seqs = config.max_num_seqs
        tokens = max(config.max_num_batched_tokens, seqs)
        graph_seqs = max_graph_seqs(seqs, tokens, config.max_model_len)  # padding sequences included
        sizes = {torch.int64: 3 * tokens + 2 * seqs, torch.int32: 2 * graph_seqs + 1 + graph_seqs * self.width + seqs}
        pin = device.type == "cuda"
        self.cpu = {dt: torch.zeros(n, dtype=dt, pin_memory=pin) for dt, n in sizes.items()}
        self.dev = {dt: torch.zeros(n, dtype=dt, device=device) for dt, n in sizes.items()} if pin else self.cpu
        self.np64, self.np32 = self.cpu[torch.int64].numpy(), self.cpu[torch.int32].numpy()
        # The pinned buffers are rewritten each step: wait until the last step's copies have read them.
        self.copied = torch.cuda.Event() if pin else None
        self._graph_cache: dict[GraphShape, StepInputs] = {}
        uses_mla = getattr(config.hf_config, "kv_lora_rank", None) is not None
        self.mla_buffers = (mla_decode_buffers(graph_seqs, self.width, device)
                            if uses_mla and config.persistent_mla_decode_metadata else None)

    def build(self, batch: list[Scheduled], shape: GraphShape | None = None, temperatures: list[float] | None = None,
              seeds: np.ndarray | None = None) -> StepInputs:
        """Inputs of one step; with shape, padded to that graph shape, whose graph samples logits row i (the i-th
        completing sequence) at temperatures[i] with Philox key seeds[i] (temperatures None: all 0, the argmax;
        seeds None: left as they are, for rows at temperature 0 do not read them)."""
        if self.copied is not None:
            self.copied.synchronize()
        n = len(batch)
        q_lens = [s.num_new_tokens for s in batch]
        n_tok = sum(q_lens)
        s_, t_ = (shape.seqs, shape.tokens) if shape else (n, n_tok)
        w = self.width if shape else _round16(max(len(s.request.block_ids) for s in batch))
        tables = self.np32[2 * s_ + 1 : 2 * s_ + 1 + s_ * w].reshape(s_, w)
        _fill_tables(tables, [s.request.block_ids for s in batch])
        if n_tok == n:
            self._fill_decodes(batch, s_, t_)
        else:
            self._fill_chunks(batch, q_lens, s_, t_, tables)
        if shape:
            self._pad(n, n_tok, s_, t_)
        rows = [i for i, s in enumerate(batch) if s.completes]
        r_ = shape.rows if shape else len(rows)
        qsl = self.np32[s_ : 2 * s_ + 1]
        logits_indices = self.np64[3 * t_ : 3 * t_ + r_]
        logits_indices[: len(rows)] = qsl[np.array(rows, dtype=np.int64) + 1] - 1
        logits_indices[len(rows) :] = 0
        if shape:
            self._fill_sampling(shape, temperatures, seeds)
            self._copy(3 * t_ + 2 * r_, 2 * s_ + 1 + s_ * w + r_)
            step = self.graph_views(shape)
        else:
            self._copy(3 * t_ + r_, 2 * s_ + 1 + s_ * w)
            step = self.views(s_, t_, w, r_, q_lens, int(self.np32[:n].max()))
        if self.mla_buffers is not None:
            self._refill_mla(step.metadata)
        return step

    def _pad(self, n: int, n_tok: int, s_: int, t_: int) -> None:
        """A graph step's padding (the module docstring): tokens n_tok.. and sequences n.. of the shape."""
        for i, pad in enumerate((0, 0, PAD_SLOT)):  # input ids, positions, slots
            self.np64[i * t_ + n_tok : (i + 1) * t_] = pad
        q = pad_lengths(t_ - n_tok, s_ - n)
        if len(q) and q.max() > self.max_model_len:
            raise ValueError(f"{t_ - n_tok} padding tokens over {s_ - n} padding sequences exceed max_model_len="
                             f"{self.max_model_len} per sequence: the graph shape has too few sequences")
        self.np32[n:s_] = q  # seq_lens: each padding sequence's context is its own tokens
        self.np32[s_ + n + 1 : 2 * s_ + 1] = n_tok + np.cumsum(q)

    def _sampling_slots(self, shape: GraphShape) -> tuple[int, int]:
        """Where a graph step keeps its temperatures (int32 buffer) and seeds (int64 buffer): after the block
        tables, and after the logits indices (the layout in the module docstring)."""
        return 2 * shape.seqs + 1 + shape.seqs * self.width, 3 * shape.tokens + shape.rows

    def _fill_sampling(self, shape: GraphShape, temperatures: list[float] | None, seeds: np.ndarray | None) -> None:
        """A graph step's temperatures (padding rows and temperatures None: 0) and seeds into their slots."""
        temp_at, seeds_at = self._sampling_slots(shape)
        temp = self.np32[temp_at : temp_at + shape.rows].view(np.float32)
        temp[:] = 0
        if temperatures is not None:
            temp[: len(temperatures)] = temperatures
        if seeds is not None:
            self.np64[seeds_at : seeds_at + shape.rows] = seeds

    def _refill_mla(self, md: AttentionMetadata) -> None:
        """The step's MLA decode metadata in the persistent buffers (device work queued behind the copies, no
        device sync), in md.mla_decode for every MLA layer of the step."""
        md.mla_decode = mla_decode_metadata(md.block_tables, md.seq_lens, self.block_size, buffers=self.mla_buffers)

    def _fill_decodes(self, batch: list[Scheduled], s_: int, t_: int) -> None:
        """One new token per sequence (the hot path): plain Python per row, few numpy calls."""
        n, bs = len(batch), self.block_size
        pos = [s.request.num_computed_tokens for s in batch]
        self.np64[:n] = [_tokens(s.request, p, 1)[0] for s, p in zip(batch, pos)]
        self.np64[t_ : t_ + n] = pos
        self.np64[2 * t_ : 2 * t_ + n] = [s.request.block_ids[p // bs] * bs + p % bs for s, p in zip(batch, pos)]
        self.np32[:n] = pos
        self.np32[:n] += 1
        self.np32[s_ : s_ + n + 1] = np.arange(n + 1)

    def _fill_chunks(self, batch: list[Scheduled], q_lens: list[int], s_: int, t_: int,
                     tables: np.ndarray) -> None:
        """Any mix of prefill chunks and decodes."""
        n, n_tok, bs = len(batch), sum(q_lens), self.block_size
        starts = np.array([s.request.num_computed_tokens for s in batch], dtype=np.int64)
        q = np.array(q_lens, dtype=np.int64)
        qsl = self.np32[s_ : s_ + n + 1]
        qsl[0] = 0
        qsl[1:] = np.cumsum(q)
        self.np32[:n] = starts + q
        self.np64[:n_tok] = [t for s in batch for t in _tokens(s.request, s.request.num_computed_tokens,
                                                                 s.num_new_tokens)]
        seq_of = np.repeat(np.arange(n), q)  # [n_tok] → owning sequence
        pos = self.np64[t_ : t_ + n_tok]
        pos[:] = np.arange(n_tok) - qsl[seq_of] + starts[seq_of]
        self.np64[2 * t_ : 2 * t_ + n_tok] = tables[seq_of, pos // bs] * bs + pos % bs

    def graph_views(self, shape: GraphShape) -> StepInputs:
        """A graph step's views: the same tensors on every replay, so built once per shape. Its hints are bounds
        (attention's grids come from tensor shapes): max_query_len T (1 for a decode shape), decodes and prefills
        both possible, the longest context max_model_len."""
        if shape not in self._graph_cache:
            t_, s_, r_ = shape
            hints = [1] * s_ if t_ == s_ else [t_] + [1] * (s_ - 1)
            views = self.views(s_, t_, self.width, r_, hints, self.max_model_len)
            temp_at, seeds_at = self._sampling_slots(shape)
            views.temperature = self.dev[torch.int32][temp_at : temp_at + r_].view(torch.float32)
            views.seeds = self.dev[torch.int64][seeds_at : seeds_at + r_]
            self._graph_cache[shape] = views
        views = self._graph_cache[shape]
        views.metadata.plan_cache.clear()  # the same metadata object serves every step of this shape
        return views

    def _copy(self, n64: int, n32: int) -> None:
        if self.copied is None:
            return
        for dt, n in ((torch.int64, n64), (torch.int32, n32)):
            self.dev[dt][:n].copy_(self.cpu[dt][:n], non_blocking=True)
        self.copied.record()

    def views(self, s_: int, t_: int, w: int, n_logits: int, q_lens: list[int], max_seq_len: int) -> StepInputs:
        """Device views for S sequences of q_lens new tokens, T tokens, table width W; max_seq_len: the longest
        context, or an upper bound of it (graph steps), as the attention kernels size their grids with it."""
        d64, d32 = self.dev[torch.int64], self.dev[torch.int32]
        md = AttentionMetadata.from_query_lens(
            q_lens,
            slot_mapping=d64[2 * t_ : 3 * t_],
            block_tables=d32[2 * s_ + 1 : 2 * s_ + 1 + s_ * w].view(s_, w),
            seq_lens=d32[:s_],
            query_start_loc=d32[s_ : 2 * s_ + 1],
            positions=d64[t_ : 2 * t_],
            max_seq_len=max_seq_len,
        )
        return StepInputs(d64[:t_], md, d64[3 * t_ : 3 * t_ + n_logits])
