"""The native host's attention layer: our own paged KV cache, bound by the model runner."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.forward_context import get_forward_context
from atom_core.layers.attention import AttentionSpec, attention_forward


class NativeAttention(nn.Module):
    # Its bound [2, num_blocks, block_size, kv_heads, d] cache may be written by the model (fused Qwen3 prologue).
    accepts_external_kv_write = True

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__()
        self.spec = spec
        self.layer_name = spec.prefix
        # [2, num_blocks, block_size, kv_heads, head_dim], bound by ModelRunner.allocate_kv_cache
        self.kv_cache = torch.tensor([])
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """query [T, heads*d], key/value [T, kv_heads*d] → [T, heads*d]"""
        md = get_forward_context().metadata_for(self.layer_name)
        if md is None or self.kv_cache.numel() == 0:  # profiling/warm-up: no cache to touch
            return torch.zeros_like(query)
        return attention_forward(self.spec, query, key, value, self.kv_cache[0], self.kv_cache[1], md,
                                 self.k_scale, self.v_scale)
