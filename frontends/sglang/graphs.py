"""The `atom` backend's part in SGLang's decode CUDA graphs: persistent metadata buffers and their refill.

SGLang's decode graph runner (DecodeCudaGraphRunner, SGLang 0.5.23) calls, per captured batch size G:
init_cuda_graph_state(max_bs, max_num_tokens) once; at capture init_forward_metadata_out_graph(fb, in_capture=True)
on a G-row DECODE batch made of its own input buffers, then run_once (a warm-up run, then the captured one), each
starting with init_forward_metadata_in_graph(fb); at every replay init_forward_metadata_out_graph(view) on the real
batch padded to G (build_replay_fb_view: req_pool_indices padded with 0, seq_lens with our fill value 1, positions
with 0; its out_cache_loc is the real batch's own, unpadded), then graph.replay().

The graph captured for G reads the tensors of the metadata object `metadata(G)` returns, views of the buffers below,
so every replay refills those same addresses, outside the graph, before replaying it: block tables gathered from
req_to_token (block size 1: a request's row IS its block table), seq_lens, slot mapping, positions and, over SGLang's
MLA pool, the MLA decode page indices. Padding rows attend to one key of req_to_token's row 0 (SGLang's padding row)
and write nowhere (slot -1), so they never touch a real request's KV. The hints are static: every row one query
token (num_decodes = G), max_seq_len = the model's context length, an upper bound of any context, so the kernels'
grids and split counts are the same on every replay. Nothing here syncs with the device (the gather, the copies and the
MLA page indices are device ops), and the per-step memo (plan_cache) is cleared at every capture run and replay.
"""

from __future__ import annotations

import torch

from atom_core.forward_context import AttentionMetadata
from atom_kernels.reference.mla import mla_decode_buffers, mla_decode_metadata

# What padding rows of a replayed batch hold in seq_lens (get_cuda_graph_seq_len_fill_value): one key to attend to,
# so the decode kernels' softmax stays finite on rows whose output SGLang drops.
SEQ_LEN_FILL_VALUE = 1
PADDING_SLOT = -1  # the kernels' "write nowhere"


def unsupported_graph(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"atom-core's SGLang attention backend takes part in decode CUDA graphs of one token per request only; "
        f"{what} is not supported: start SGLang with --cuda-graph-backend-prefill=breakable or disabled "
        "(prefill), without speculative decoding, or with --disable-cuda-graph")


class DecodeGraphBuffers:
    """Persistent metadata of SGLang's decode graphs, for batches of up to max_bs requests of one new token."""

    def __init__(self, max_bs: int, max_num_tokens: int, req_to_token: torch.Tensor, mla: bool,
                 context_len: int) -> None:
        """req_to_token: SGLang's [max_reqs + 1, max_context_len] int32 table (row 0: its padding row; a few columns
        past the model's context_len); context_len: the longest sequence SGLang admits, the graphs' max_seq_len hint
        (the bound kernel_warmup compiled the kernels' variants for)."""
        if max_num_tokens != max_bs:
            raise unsupported_graph(f"a graph of {max_num_tokens} tokens for {max_bs} requests (speculative "
                                    "decoding's verify/draft graphs)")
        device, width = req_to_token.device, req_to_token.shape[1]
        self.req_to_token, self.max_seq_len = req_to_token, min(context_len, width)
        self.block_tables = torch.zeros(max_bs, width, dtype=torch.int32, device=device)  # [G, max_context_len]
        self.seq_lens = torch.full((max_bs,), SEQ_LEN_FILL_VALUE, dtype=torch.int32, device=device)
        # one query token per row, padding rows too: the same offsets on every step, written once
        self.query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.slot_mapping = torch.full((max_bs,), PADDING_SLOT, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        # MLA pool: the decode kernels read pages in CSR form (kv_indptr [G + 1], kv_indices [G * width])
        self.mla = mla_decode_buffers(max_bs, width, device) if mla else None
        if self.mla is not None:
            self.mla.kv_indices.zero_()  # never a garbage slot id, even past a step's pages
        self._metadata: dict[int, AttentionMetadata] = {}

    @property
    def max_bs(self) -> int:
        return self.seq_lens.shape[0]

    def metadata(self, bs: int) -> AttentionMetadata:
        """The metadata a graph of bs rows is captured with and replays: views of the buffers, made once per bs."""
        md = self._metadata.get(bs)
        if md is None:
            if not 0 < bs <= self.max_bs:
                raise ValueError(f"a decode graph of {bs} requests; the buffers hold 1..{self.max_bs}")
            md = self._metadata[bs] = AttentionMetadata.from_query_lens(
                [1] * bs, slot_mapping=self.slot_mapping[:bs], block_tables=self.block_tables[:bs],
                seq_lens=self.seq_lens[:bs], query_start_loc=self.query_start_loc[: bs + 1],
                positions=self.positions[:bs], max_seq_len=self.max_seq_len)
        return md

    def refill(self, forward_batch) -> AttentionMetadata:
        """Write a padded decode batch (SGLang's capture batch or replay view, batch_size = the graph's G) into the
        buffers; returns metadata(G). Device ops only: index_select/copy_/fill_ and the MLA page indices."""
        bs = forward_batch.batch_size
        md = self.metadata(bs)
        torch.index_select(self.req_to_token, 0, forward_batch.req_pool_indices[:bs], out=self.block_tables[:bs])
        self.seq_lens[:bs].copy_(forward_batch.seq_lens[:bs])
        loc = forward_batch.out_cache_loc  # the real rows' slots at a replay; all G rows' at capture
        n = loc.shape[0]
        self.slot_mapping[:n].copy_(loc)
        self.slot_mapping[n:bs].fill_(PADDING_SLOT)
        self.positions[:bs].copy_(forward_batch.positions[:bs])
        if self.mla is not None:
            # block size 1: a page is a slot; no memo, so this step's pages are written into the buffers
            md.mla_decode = mla_decode_metadata(md.block_tables, md.seq_lens, 1, buffers=self.mla)
        md.plan_cache.clear()  # one metadata object serves every step of this size
        return md
