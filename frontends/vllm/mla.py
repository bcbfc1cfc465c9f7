"""The vLLM host's MLA attention layer (the `atom_attention_impl` answer for an MLA spec on host "vllm").

Its KV-cache spec is vLLM's MLAAttentionSpec: one "head" of kv_lora_rank + qk_rope_head_dim per token, no
separate V (a FullAttentionSpec would allocate twice the memory). vLLM binds a [num_blocks, 1, block_size,
r + rope] view; its head 0 is the logical [num_blocks, block_size, r + rope] cache atom_kernels' MLA ops read
and write in place. The call goes through the same opaque op as full attention (atom::vllm_attention, layer
looked up by name), with the latent rows as its `key` and no `value`.
"""

from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import KVCacheSpec, MLAAttentionSpec, get_kv_quant_mode

from atom_core.forward_context import AttentionMetadata
from atom_core.layers.attention import AttentionSpec, mla_forward
from atom_frontends.vllm.attention import AttentionForVllm
from atom_frontends.vllm.backend import real_rows, warm_up_once


class AtomMLAImpl:
    """Writes this step's latent rows and attends over the latent cache (atom_core's mla_forward)."""

    def __init__(self, spec: AttentionSpec) -> None:
        self.spec = spec
        self.warm_bounds: tuple[int, int] | None = None  # see backend.warm_up_once

    def forward(self, layer, query: torch.Tensor, latent: torch.Tensor | None, value: None,
                kv_cache: torch.Tensor, md: AttentionMetadata, output: torch.Tensor) -> torch.Tensor:
        """query [T, heads, r + rope], latent [T, r + rope], output [T, heads, r] (written, returned). Rows past
        the metadata's tokens are vLLM's padding: not written to the cache, their output rows zeros."""
        n = real_rows(query, md, output)
        query, latent = query[:n], None if latent is None else latent[:n]
        cache = kv_cache[:, 0]  # [num_blocks, block_size, r + rope]
        if cache.dtype == torch.uint8:  # vLLM keeps fp8 caches as bytes; ours are e4m3
            cache = cache.view(torch.float8_e4m3fn)
        scale = layer._k_scale if self.spec.kv_cache_dtype.startswith("fp8") else None
        warm_up_once(self, (cache,), query.dtype, scale, None)
        mla_forward(self.spec, query, latent, cache, md, scale, out=output[:n])
        return output


class MLAAttentionForVllm(AttentionForVllm):
    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.head_size_v = spec.kv_lora_rank
        warm_bounds = self.impl.warm_bounds
        self.impl = AtomMLAImpl(spec)
        self.impl.warm_bounds = warm_bounds

    def forward(self, query: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """query [T, heads, r + rope], latent [T, r + rope] → [T, heads, r]"""
        output = query.new_empty(*query.shape[:2], self.spec.kv_lora_rank)
        torch.ops.atom.vllm_attention(query, latent, None, output, self.layer_name)
        return output

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        return MLAAttentionSpec(block_size=vllm_config.cache_config.block_size, num_kv_heads=1,
                                head_size=self.head_size, dtype=self.kv_cache_torch_dtype,
                                kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype),
                                cache_dtype_str=self.kv_cache_dtype)
