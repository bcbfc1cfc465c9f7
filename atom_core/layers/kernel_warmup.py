"""Kernel warm-up: compile at start-up what would otherwise compile inside a serving step.

JIT kernels (Triton) compile one variant per shape class; a class first met mid-serving costs its compile time
inside a step (e.g. at the first prefix-cache hit of a run). Each kernel module states the shapes
reaching every class it compiles, next to its bucketing (`warm_up_shapes`, found through
atom_kernels.dispatch.warm_up_shapes); `warm_up` is the one entry every host calls, at the moment its layers and
caches exist: it runs each attention layer over its kernel's warm-up batches (reading the cache at block 0 only,
the K/V write skipped, the results discarded) and each MoE layer of a model at its kernel's token counts. Kernels
that compile nothing (the torch reference, the CPU kernels) state no shapes and are skipped; layers of one shape
warm up once per process.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from typing import NamedTuple

import torch

from atom_core.forward_context import AttentionMetadata
from atom_core.layers.attention import AttentionSpec, attention_forward, mla_forward
from atom_core.layers.moe import MoE
from atom_kernels import dispatch

_WARM: set[tuple] = set()  # the keys warm_up has run in this process


class AttentionCaches(NamedTuple):
    """One attention layer to warm up. caches: (k_cache, v_cache) views [num_blocks, block_size, kv_heads,
    head_dim] for full attention, (latent cache [num_blocks, block_size, r + rope],) for MLA."""

    spec: AttentionSpec
    caches: tuple[torch.Tensor, ...]
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


def capturing(device: torch.device) -> bool:
    """Inside a CUDA graph capture (nothing may launch there but the graph's own work)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@torch.inference_mode()
def warm_up(dtype: torch.dtype, max_model_len: int, max_tokens: int, *, model: torch.nn.Module | None = None,
            attention: Iterable[AttentionCaches] = ()) -> int:
    """Compile the kernels' shape classes for steps of up to max_tokens tokens over contexts of up to
    max_model_len: every layer of `attention`, and every MoE layer of `model`. dtype: the model's activation
    dtype. Returns how many runs there were (0: nothing to compile, or already warm)."""
    runs = sum(_warm_attention(layer, dtype, max_model_len, max_tokens) for layer in attention)
    if model is not None:
        runs += sum(_warm_moe(layer, dtype, max_tokens) for layer in model.modules() if isinstance(layer, MoE))
    return runs


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


def _warm_attention(layer: AttentionCaches, dtype: torch.dtype, max_model_len: int, max_tokens: int) -> int:
    spec, caches = layer.spec, layer.caches
    device = caches[0].device
    shapes = dispatch.warm_up_shapes(spec.kernel_ops[1], device)
    if shapes is None or capturing(device):
        return 0
    # What a compiled variant depends on: the spec but its name, dtypes, cache strides, the bucket bounds.
    key = (dataclasses.replace(spec, prefix=""), dtype, device, max_model_len, max_tokens, layer.k_scale is None,
           tuple((c.dtype, c.shape[1:], c.stride()[1:]) for c in caches))
    if key in _WARM:
        return 0
    _WARM.add(key)
    block_size = caches[0].shape[1]
    batches = shapes(max_model_len, max_tokens)
    for q_lens, seq_lens, hint in batches:
        md = _metadata(q_lens, seq_lens, hint, block_size, device)
        tokens = sum(q_lens)
        if spec.is_mla:
            query = torch.zeros(tokens, spec.num_heads, spec.head_dim, dtype=dtype, device=device)
            mla_forward(spec, query, None, caches[0], md, layer.k_scale)
        else:
            query = torch.zeros(tokens, spec.num_heads * spec.head_dim, dtype=dtype, device=device)
            attention_forward(spec, query, None, None, caches[0], caches[1], md, layer.k_scale, layer.v_scale)
    return len(batches)


def _warm_moe(layer: MoE, dtype: torch.dtype, max_tokens: int) -> int:
    """Run the layer (router, experts, shared experts) on random hidden states of each warm-up token count."""
    w13, w2 = layer.experts.gate_up_proj, layer.experts.down_proj
    shapes = dispatch.warm_up_shapes("fused_moe", w13.device)
    if shapes is None or capturing(w13.device):
        return 0
    key = ("moe", tuple(w13.shape), tuple(w2.shape), layer.gate.config, dtype, w13.device, max_tokens)
    if key in _WARM:
        return 0
    _WARM.add(key)
    counts = shapes(max_tokens)
    for t in counts:
        layer(torch.randn(t, w13.shape[2], dtype=dtype, device=w13.device))
    return len(counts)
