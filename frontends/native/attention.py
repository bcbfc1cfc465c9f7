"""The native host's attention layer: our own paged KV cache, bound by the model runner."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.forward_context import get_forward_context
from atom_core.layers.attention import AttentionSpec, attention_forward


class NativeAttention(nn.Module):
    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__()
        self.spec = spec
        self.layer_name = spec.prefix
        # [2, num_blocks, block_size, kv_heads, head_dim], bound by ModelRunner.allocate_kv_cache
        self.kv_cache = torch.tensor([])
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None

    def _step_metadata(self):
        """This step's metadata, or None when there is no cache to touch (profiling / warm-up)."""
        md = get_forward_context().metadata_for(self.layer_name)
        return None if md is None or self.kv_cache.numel() == 0 else md

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """query [T, heads*d], key/value [T, kv_heads*d] → [T, heads*d]"""
        md = self._step_metadata()
        if md is None:
            return torch.zeros_like(query)
        return attention_forward(self.spec, query, key, value, self.kv_cache[0], self.kv_cache[1], md,
                                 self.k_scale, self.v_scale)

    def kv_cache_write_args(self) -> tuple | None:
        """What the model needs to write this step's K/V itself (the fused Qwen3 prologue): (k_cache,
        v_cache, slot_mapping, k_scale, v_scale), or None when there is no cache to touch."""
        md = self._step_metadata()
        if md is None:
            return None
        return self.kv_cache[0], self.kv_cache[1], md.slot_mapping, self.k_scale, self.v_scale
