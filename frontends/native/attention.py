"""The native host's attention layers: our own paged KV cache, bound by the model runner.

Each layer says the shape of its cache (`cache_shape`), so the runner sizes and allocates caches per spec:
full attention holds K and V per KV head, an MLA layer one latent row per token.
"""

from __future__ import annotations

import torch
from torch import nn

from atom_core.forward_context import get_forward_context
from atom_core.layers.attention import (
    FULL_ATTENTION_OPS,
    MLA_OPS,
    AttentionSpec,
    attention_forward,
    mla_forward,
    qk_norm_rope_attention_forward,
)


class NativeCacheLayer(nn.Module):
    """What the runner needs of an attention layer: its cache shape, the cache and fp8 scales it binds."""

    # Ops this layer runs whose torch reference syncs with the CPU (not capturable in a CUDA graph).
    syncing_ops: tuple[str, ...] = ()

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__()
        self.spec = spec
        self.layer_name = spec.prefix
        self.kv_cache = torch.tensor([])  # bound by ModelRunner.allocate_kv_cache, of cache_shape(...)
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def kv_cache(self) -> torch.Tensor:
        return self._kv_cache

    @kv_cache.setter
    def kv_cache(self, cache: torch.Tensor) -> None:
        self._kv_cache = cache
        self._views = self._views_of(cache) if cache.numel() else ()  # made once, not per layer call

    def cache_views(self) -> tuple[torch.Tensor, ...]:
        """The cache as the attention ops read it: (k_cache, v_cache), or (latent cache,) for MLA."""
        return self._views

    def _views_of(self, cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def _step_metadata(self):
        """This step's metadata, or None when there is no cache to touch (profiling / warm-up)."""
        md = get_forward_context().metadata_for(self.layer_name)
        return None if md is None or self.kv_cache.numel() == 0 else md


class NativeAttention(NativeCacheLayer):
    syncing_ops = (*FULL_ATTENTION_OPS, "fused_qk_norm_rope_write_kv")

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, self.spec.num_kv_heads, self.spec.head_dim)  # K, V

    def _views_of(self, cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return cache[0], cache[1]

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """query [T, heads*d], key/value [T, kv_heads*d] → [T, heads*d]"""
        md = self._step_metadata()
        if md is None:
            return torch.zeros_like(query)
        return attention_forward(self.spec, query, key, value, *self._views, md, self.k_scale, self.v_scale)

    fuses_qk_norm_rope = True  # forward_qk_norm_rope: the model may hand this layer Qwen3's q/k norm + rotary

    def forward_qk_norm_rope(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, norm_rope: tuple) -> torch.Tensor:
        """Qwen3's q/k norm + rotary fused with this step's K/V write, then attention (see
        qk_norm_rope_attention_forward): query [T, heads, d], key/value [T, kv_heads, d] → [T, heads*d]."""
        md = self._step_metadata()
        if md is None:
            return query.new_zeros(query.shape[0], self.spec.num_heads * self.spec.head_dim)
        return qk_norm_rope_attention_forward(self.spec, positions, query, key, value, norm_rope, *self._views, md,
                                              self.k_scale, self.v_scale)


class NativeMLAAttention(NativeCacheLayer):
    """MLA over a latent cache [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]; an fp8 cache uses
    k_scale as its one per-tensor scale."""

    syncing_ops = MLA_OPS

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (num_blocks, block_size, self.spec.head_dim)

    def _views_of(self, cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (cache,)

    def forward(self, query: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """query [T, heads, r + rope], latent [T, r + rope] → [T, heads, r] (see mla_forward)."""
        md = self._step_metadata()
        if md is None:
            return query.new_zeros(*query.shape[:2], self.spec.kv_lora_rank)
        return mla_forward(self.spec, query, latent, self.kv_cache, md, self.k_scale)
