"""atom-core's vLLM attention backend: registered as "ATOM" with vLLM's register_backend.

The backend's impl runs the ONE shared computation (atom_core.layers.attention.attention_forward) on
vLLM's per-layer KV cache in place; its builder (metadata.py) turns vLLM's CommonAttentionMetadata
into the core's AttentionMetadata.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl, AttentionType
from vllm.v1.kv_cache_layout import KVCacheLayout

from atom_core.forward_context import AttentionMetadata
from atom_core.layers.attention import AttentionSpec, attention_forward, qk_norm_rope_attention_forward
from atom_core.layers.kernel_warmup import AttentionCaches, capturing, warm_up
from atom_kernels import dispatch

BACKEND_NAME = "ATOM"
BACKEND_PATH = "atom_frontends.vllm.backend.AtomAttentionBackend"


def register_attention_backend() -> None:
    """Register (or re-point, when already registered in this process) the "ATOM" backend name."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if BACKEND_NAME in AttentionBackendEnum.__members__:
        register_backend(AttentionBackendEnum.__members__[BACKEND_NAME], BACKEND_PATH)
    else:
        register_backend(BACKEND_NAME, BACKEND_PATH)


def split_kv_cache(kv_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's per-layer view [num_blocks, kv_heads, block_size, 2*head_dim] (strides set by the negotiated
    layout) → K and V views [num_blocks, block_size, kv_heads, head_dim], the logical shape atom_kernels
    read. No copy. The page bytes are ours to order: a head-major page (layout LBHNC: [block_size, 2*head_dim]
    contiguous per block and head) holds block_size K rows then block_size V rows, as vLLM's CPU attention
    kernels want (cpu_kernels.py); other layouts hold K then V on the last dim. vLLM keeps fp8 caches as uint8
    bytes; our fp8 kinds (fp8, fp8_e4m3) are e4m3, so those bytes are viewed as float8_e4m3fn."""
    if kv_cache.dtype == torch.uint8:
        kv_cache = kv_cache.view(torch.float8_e4m3fn)
    blocks, heads, block_size, _ = kv_cache.shape
    if kv_cache.stride()[1:] == (2 * block_size * head_dim, 2 * head_dim, 1):
        k, v = kv_cache.view(blocks, heads, 2, block_size, head_dim).unbind(2)
        return k.transpose(1, 2), v.transpose(1, 2)
    return kv_cache[..., :head_dim].transpose(1, 2), kv_cache[..., head_dim:].transpose(1, 2)


def real_rows(query: torch.Tensor, md: AttentionMetadata, output: torch.Tensor) -> int:
    """The step's real token rows n (the metadata's); vLLM's padding rows beyond them get zeros in output."""
    n = md.num_tokens
    if query.shape[0] < n:
        raise ValueError(f"attention got {query.shape[0]} query rows for a batch of {n} tokens; vLLM "
                         f"pads a step's rows, never drops them: the metadata is not this step's")
    if query.shape[0] > n:
        output[n:].zero_()
    return n


def warm_up_once(impl, caches: tuple[torch.Tensor, ...], dtype: torch.dtype, k_scale, v_scale) -> None:
    """The layer's attention warm-up (kernel_warmup) on its first call with a bound cache outside a graph
    capture: vLLM binds caches after building the model, then runs its warm-up batches and the piecewise
    captures eagerly between graph pieces, so this happens at start-up. impl.warm_bounds: (max_model_len,
    max_num_batched_tokens), set by the layer (None: no warm-up)."""
    if impl.warm_bounds is None or capturing(caches[0].device):
        return
    max_model_len, max_query_len = impl.warm_bounds
    impl.warm_bounds = None
    warm_up(dtype, max_model_len, max_query_len, attention=[AttentionCaches(impl.spec, caches, k_scale, v_scale)])


class AtomAttentionImpl(AttentionImpl[AttentionMetadata]):
    """Holds the layer's AttentionSpec; forward writes this step's K/V and attends, via atom_kernels."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes=None, sliding_window: int | None = None, kv_cache_dtype: str = "auto",
                 logits_soft_cap=None, attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None, *, prefix: str = "") -> None:
        if alibi_slopes is not None or logits_soft_cap or kv_sharing_target_layer_name is not None:
            raise NotImplementedError("atom-core attention supports neither ALiBi, logit soft-capping "
                                      "nor KV sharing")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"atom-core attention supports decoder attention only, not {attn_type}")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.spec = AttentionSpec(num_heads, head_size, scale, self.num_kv_heads, prefix,
                                  sliding_window, kv_cache_dtype)
        self.warm_bounds: tuple[int, int] | None = None  # see warm_up_once

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: AttentionMetadata, output: torch.Tensor,
                output_scale: torch.Tensor | None = None, output_block_scale: torch.Tensor | None = None,
                ) -> torch.Tensor:
        """query [T, heads*d], key/value [T, kv_heads*d] (None: already in the cache), output [T, heads*d]
        (written in place, returned). T may exceed the metadata's tokens (vLLM pads rows for CUDA graphs
        and data parallelism): the padding rows are neither written to the cache nor attended, and
        their output rows are zeros."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("atom-core attention does not fuse output quantization")
        n = real_rows(query, attn_metadata, output)
        query = query[:n]  # views of the real rows: no copy, no device sync
        key, value = (None, None) if key is None else (key[:n], value[:n])
        k_cache, v_cache, k_scale, v_scale = self._caches(layer, kv_cache, query.dtype)
        attention_forward(self.spec, query, key, value, k_cache, v_cache, attn_metadata,
                          k_scale, v_scale, out=output[:n])
        return output

    def forward_qk_norm_rope(self, layer, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, norm_rope: tuple, kv_cache: torch.Tensor,
                             attn_metadata: AttentionMetadata, output: torch.Tensor) -> torch.Tensor:
        """forward with Qwen3's q/k norm + rotary fused into the K/V write (qk_norm_rope_attention_forward):
        positions [T], query [T, heads, d], key/value [T, kv_heads, d], output [T, heads*d]; padding rows as in
        forward."""
        n = real_rows(query, attn_metadata, output)
        k_cache, v_cache, k_scale, v_scale = self._caches(layer, kv_cache, query.dtype)
        qk_norm_rope_attention_forward(self.spec, positions[:n], query[:n], key[:n], value[:n], norm_rope,
                                       k_cache, v_cache, attn_metadata, k_scale, v_scale, out=output[:n])
        return output

    def _caches(self, layer, kv_cache: torch.Tensor, dtype: torch.dtype) -> tuple:
        """(k_cache, v_cache, k_scale, v_scale) of the layer's cache, its attention warmed up on first use."""
        k_cache, v_cache = split_kv_cache(kv_cache, self.head_size)
        quantized = self.kv_cache_dtype.startswith("fp8")
        k_scale = layer._k_scale if quantized else None
        v_scale = layer._v_scale if quantized else None
        warm_up_once(self, (k_cache, v_cache), dtype, k_scale, v_scale)
        return k_cache, v_cache, k_scale, v_scale


class AtomAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update = True  # our forward writes the KV cache itself
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "fp8", "fp8_e4m3"]

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[AtomAttentionImpl]:
        return AtomAttentionImpl

    @staticmethod
    def get_builder_cls():
        from atom_frontends.vllm.metadata import AtomMetadataBuilder

        return AtomMetadataBuilder

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # atom_kernels take K/V as strided views, so every layout works; token-major (NHD) pages
        # match our logical [blocks, block_size, kv_heads, head_dim] best, so they come first, unless
        # vLLM's CPU attention kernels serve our ops (cpu_kernels.py): they read head-major pages only.
        first = (KVCacheLayout.LBNHC, KVCacheLayout.BLNHC)
        if dispatch.backend_for("paged_attention", "cpu") == "provided":
            first = (KVCacheLayout.LBHNC, *first)
        return first + tuple(layout for layout in KVCacheLayout if layout not in first)
