"""Kernel warm-up: compile at start-up what would otherwise compile inside a serving step.

JIT kernels (Triton) compile one variant per shape class. The attention kernels pick their tiles by the
power-of-two bucket of the longest query, run decodes by a separate kernel whose split count (and merge
tile) follows the power-of-two bucket of the context-length hint, and skip decodes or not by whether the
batch has any; the MoE kernels pick GEMV or tiled GEMMs, tiles and the alignment's chunk by the step's
token count. A class first met mid-serving costs its compile time (0.3-1 s on an H100 machine) inside a step:
measured in vLLM on the H100, the first prefix-cache hit of a run (a 16-token query over a cached prefix)
cost ~0.45 s and cut batch-1 decode throughput to 0.37 of vLLM's own.

`warm_up_attention` runs a layer's attention once per class serving can meet: a query of each power-of-two
length up to the step's token budget (and that budget itself), alone and next to a decode, and a decode under
each power-of-two context hint up to max_model_len. It only reads the cache (block 0; the K/V write is
skipped) and discards the results. `warm_up_moe` runs each MoE layer at every token count up to 512 (where
tiles and the alignment's chunk change together, on joint bounds) and at powers of two above, up to the budget.
Powers of two reach every bucket of one power-of-two bound (consecutive powers are one bucket apart), and
tests/kernels/test_kernel_warmup.py checks these counts against the kernels' own config functions. Backends
that do not compile per shape (the torch reference) skip both; layers of one shape warm up once per process.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from atom_core.forward_context import AttentionMetadata
from atom_core.layers.attention import AttentionSpec, attention_forward, mla_forward
from atom_core.layers.moe import MoE
from atom_kernels import dispatch

_WARM: set[tuple] = set()  # the keys warm_up_attention / warm_up_moe have run in this process
_DENSE_MOE_TOKENS = 512


def capturing(device: torch.device) -> bool:
    """Inside a CUDA graph capture (nothing may launch there but the graph's own work)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _powers_of_two_up_to(top: int, start: int) -> list[int]:
    """start, 2 * start, ... below top, then top itself (top >= start)."""
    out = []
    while start < top:
        out.append(start)
        start *= 2
    return [*out, top]


def moe_token_counts(max_tokens: int) -> list[int]:
    """1, 2, ..., 512, then 1024, 2048, ... below max_tokens, then max_tokens (all capped by max_tokens)."""
    dense = list(range(1, min(max_tokens, _DENSE_MOE_TOKENS) + 1))
    return dense + ([] if max_tokens <= _DENSE_MOE_TOKENS else _powers_of_two_up_to(max_tokens, 2 * _DENSE_MOE_TOKENS))


def warm_up_batches(max_model_len: int, max_query_len: int) -> list[tuple[list[int], list[int], int]]:
    """(query lengths, sequence lengths, max_seq_len hint) of each batch warm_up_attention runs."""
    top = min(max_query_len, max_model_len)
    lens = _powers_of_two_up_to(top, 2) if top > 1 else []
    batches = [([q], [q], q) for q in lens]  # a prefill alone
    batches += [([1, q], [2, q], q) for q in lens]  # next to a decode
    return batches + [([1], [1], hint) for hint in _powers_of_two_up_to(max_model_len, 1)]  # decodes


def _metadata(q_lens: list[int], seq_lens: list[int], hint: int, block_size: int, device) -> AttentionMetadata:
    """Every page of every sequence is block 0; no slot is written (the layers get key=None)."""
    as_int = dict(dtype=torch.int32, device=device)
    qsl = torch.tensor([0, *itertools.accumulate(q_lens)], **as_int)
    tokens = sum(q_lens)
    return AttentionMetadata.from_query_lens(
        q_lens, slot_mapping=torch.full((tokens,), -1, dtype=torch.int64, device=device),
        block_tables=torch.zeros(len(q_lens), -(-max(hint, *seq_lens) // block_size), **as_int),
        seq_lens=torch.tensor(seq_lens, **as_int), query_start_loc=qsl,
        positions=torch.zeros(tokens, dtype=torch.int64, device=device), max_seq_len=hint,
    )


@torch.inference_mode()
def warm_up_attention(spec: AttentionSpec, caches: tuple[torch.Tensor, ...], dtype: torch.dtype, max_model_len: int,
                      max_query_len: int, k_scale: torch.Tensor | None = None,
                      v_scale: torch.Tensor | None = None) -> int:
    """Run the layer's attention over every batch of warm_up_batches, once per process for layers of one shape;
    returns how many batches ran (0: nothing to warm, or already warm).

    caches: (k_cache, v_cache) views [num_blocks, block_size, kv_heads, head_dim] for full attention, (latent
    cache [num_blocks, block_size, r + rope],) for MLA; dtype: the model's activation dtype (the query's)."""
    device = caches[0].device
    if dispatch.backend(spec.kernel_ops[1], device) != "triton" or capturing(device):
        return 0
    # What a compiled variant depends on: the spec but its name, dtypes, cache strides, the bucket bounds.
    key = (dataclasses.replace(spec, prefix=""), dtype, device, max_model_len, max_query_len, k_scale is None,
           tuple((c.dtype, c.shape[1:], c.stride()[1:]) for c in caches))
    if key in _WARM:
        return 0
    _WARM.add(key)
    block_size = caches[0].shape[1]
    batches = warm_up_batches(max_model_len, max_query_len)
    for q_lens, seq_lens, hint in batches:
        md = _metadata(q_lens, seq_lens, hint, block_size, device)
        tokens = sum(q_lens)
        if spec.is_mla:
            query = torch.zeros(tokens, spec.num_heads, spec.head_dim, dtype=dtype, device=device)
            mla_forward(spec, query, None, caches[0], md, k_scale)
        else:
            query = torch.zeros(tokens, spec.num_heads * spec.head_dim, dtype=dtype, device=device)
            attention_forward(spec, query, None, None, caches[0], caches[1], md, k_scale, v_scale)
    return len(batches)


@torch.inference_mode()
def warm_up_moe(model: torch.nn.Module, dtype: torch.dtype, max_tokens: int) -> int:
    """Run every MoE layer of `model` (router, experts, shared experts) on moe_token_counts(max_tokens) tokens of
    random hidden states; returns how many runs there were (0: no MoE layer, nothing to compile, or warm)."""
    runs = 0
    for layer in (m for m in model.modules() if isinstance(m, MoE)):
        w13, w2 = layer.experts.gate_up_proj, layer.experts.down_proj
        if dispatch.backend("fused_moe", w13.device) != "triton" or capturing(w13.device):
            return 0
        key = ("moe", tuple(w13.shape), tuple(w2.shape), layer.gate.config, dtype, w13.device, max_tokens)
        if key in _WARM:
            continue
        _WARM.add(key)
        for t in moe_token_counts(max_tokens):
            layer(torch.randn(t, w13.shape[2], dtype=dtype, device=w13.device))
            runs += 1
    return runs
