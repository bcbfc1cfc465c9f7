"""SGLang ForwardBatch → the core's AttentionMetadata (the SGLang `atom_metadata_builder`).

SGLang's KV pool holds one token per slot ([slots, kv_heads, head_dim] per layer) and
`req_to_token[req_pool_idx, pos]` is the slot of a request's token at `pos`. With a block size of
one, a request's row of req_to_token IS its block table and `out_cache_loc` IS the slot mapping, so
the kernels read and write SGLang's pool in place.
"""

from __future__ import annotations

import torch

from atom_core.forward_context import AttentionMetadata

# Forward modes served: EXTEND (prefill, possibly over a radix-cached prefix), MIXED (extends plus
# one-token decode tails), DECODE. IDLE has no tokens (no metadata).
EXTEND_MODES = ("EXTEND", "MIXED")


def _cpu_list(host: list | torch.Tensor | None, device_tensor: torch.Tensor) -> list[int]:
    """A CPU copy SGLang already keeps, else one sync to read the device tensor."""
    if host is None:
        host = device_tensor
    return [int(x) for x in (host.tolist() if isinstance(host, torch.Tensor) else host)]


def build_metadata(forward_batch, req_to_token: torch.Tensor) -> AttentionMetadata | None:
    """forward_batch: sglang ForwardBatch; req_to_token: [max_reqs + 1, max_context_len] int32.

    Returns None for IDLE batches (nothing to attend); raises for modes this backend lacks.
    """
    mode = forward_batch.forward_mode
    if mode.is_idle() or forward_batch.batch_size == 0:
        return None
    seq_lens = _cpu_list(forward_batch.seq_lens_cpu, forward_batch.seq_lens)
    bs = len(seq_lens)
    if mode.is_decode():
        q_lens = [1] * bs
    elif mode.name in EXTEND_MODES:
        q_lens = _cpu_list(forward_batch.extend_seq_lens_cpu, forward_batch.extend_seq_lens)
    else:
        raise NotImplementedError(
            f"atom-core's SGLang attention backend does not support forward mode {mode.name} yet "
            "(supported: EXTEND, MIXED, DECODE, IDLE); speculative decoding, split prefill and dLLM "
            "need another --attention-backend"
        )
    device = forward_batch.seq_lens.device
    qsl = [0]
    for n in q_lens:
        qsl.append(qsl[-1] + n)
    max_seq_len = max(seq_lens)
    # [bs, max_seq_len] int32: slot of each position of each request (block size 1)
    block_tables = req_to_token[forward_batch.req_pool_indices.long(), :max_seq_len]
    return AttentionMetadata.from_query_lens(
        q_lens,
        slot_mapping=forward_batch.out_cache_loc.to(torch.int64),
        block_tables=block_tables,
        seq_lens=forward_batch.seq_lens.to(torch.int32),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32).to(device, non_blocking=True),
        positions=forward_batch.positions.to(torch.int64),
        max_seq_len=max_seq_len,
    )
