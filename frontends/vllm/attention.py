"""The vLLM host's attention layer (the `atom_attention_impl` answer for host "vllm").

vLLM finds the layer in compilation_config.static_forward_context under its prefix (e.g.
"model.layers.3.self_attn.attn"), asks it for its backend and KV-cache spec, binds `kv_cache`
(a [num_blocks, kv_heads, block_size, 2*head_dim] view) and, per step, puts our metadata in its
forward context under the layer name. The attention call is the opaque custom op
atom::vllm_attention taking the layer NAME: traced inline under torch.compile, the profiling
branch (no metadata, no cache) would be baked into the graph and every step would return zeros.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.platforms import current_platform
from vllm.utils.torch_utils import direct_register_custom_op, kv_cache_dtype_str_to_dtype
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec, get_kv_quant_mode

from atom_core.layers.attention import FULL_ATTENTION_OPS, AttentionSpec
from atom_frontends.vllm.backend import AtomAttentionBackend, AtomAttentionImpl, register_attention_backend
from atom_frontends.vllm.cpu_kernels import register_vllm_kernels
from atom_frontends.vllm.platforms import ATTENTION_OP, QK_NORM_ROPE_ATTENTION_OP
from atom_kernels import dispatch

# vLLM micro-batching (--enable-dbo, --ubatch-size > 1) gives each micro-batch a thread and a forward
# context of its own, holding that micro-batch's metadata dict, and the layer gets that micro-batch's
# rows (UBatchWrapper): nothing to pick here. The list of those dicts is only in the runner's context,
# where a layer would see the whole step's rows, which no single micro-batch's metadata describes.
_MICRO_BATCH_LIST = (
    "vLLM's forward context holds per-micro-batch attention metadata (a list): the model ran outside "
    "vLLM's micro-batch threads, where no one metadata fits the step's rows. Run it through vLLM's "
    "UBatchWrapper, which gives each micro-batch its own forward context, or turn micro-batching off "
    "(drop --enable-dbo, --ubatch-size 0)."
)


def _step(layer_name: str, output: torch.Tensor):
    """(our layer, its metadata this step), or None with output zeroed (profiling / warm-up: no cache to touch)."""
    ctx = get_forward_context()
    layer = ctx.no_compile_layers[layer_name]
    md = ctx.attn_metadata
    if isinstance(md, list):
        raise ValueError(_MICRO_BATCH_LIST)
    md = md.get(layer_name) if isinstance(md, dict) else md
    if md is None or layer.kv_cache.numel() == 0:
        output.zero_()
        return None
    return layer, md


def vllm_attention(query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None,
                   output: torch.Tensor, layer_name: str) -> None:
    """Write K/V into the layer's cache (unless key is None: already written) and attend, into `output`."""
    if step := _step(layer_name, output):
        layer, md = step
        layer.impl.forward(layer, query, key, value, layer.kv_cache, md, output)


def _vllm_attention_fake(query, key, value, output, layer_name) -> None:
    return None


def vllm_qk_norm_rope_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                positions: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                                cos_sin_cache: torch.Tensor, output: torch.Tensor, layer_name: str,
                                eps: float) -> None:
    """vllm_attention with Qwen3's q/k norm + rotary fused into the K/V write (one kernel before attending)."""
    if step := _step(layer_name, output):
        layer, md = step
        layer.impl.forward_qk_norm_rope(layer, positions, query, key, value,
                                        (q_weight, k_weight, eps, cos_sin_cache), layer.kv_cache, md, output)


def _vllm_qk_norm_rope_attention_fake(query, key, value, positions, q_weight, k_weight, cos_sin_cache, output,
                                      layer_name, eps) -> None:
    return None


# vLLM's own registration path (a torch library op dispatched straight to the platform's key): far less Python
# per call than torch.library.custom_op (docs/vllm.md), and this op runs eagerly once per layer in every step
# vLLM does not replay as a full CUDA graph.
_LIB = torch.library.Library(ATTENTION_OP.split("::")[0], "FRAGMENT")
direct_register_custom_op(ATTENTION_OP.split("::")[1], vllm_attention, mutates_args=["output"],
                          fake_impl=_vllm_attention_fake, target_lib=_LIB)
direct_register_custom_op(QK_NORM_ROPE_ATTENTION_OP.split("::")[1], vllm_qk_norm_rope_attention,
                          mutates_args=["output"], fake_impl=_vllm_qk_norm_rope_attention_fake, target_lib=_LIB)


class AttentionForVllm(nn.Module, AttentionLayerBase):
    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__()
        vllm_config = get_current_vllm_config()
        register_attention_backend()  # idempotent; covers a VLLM_PLUGINS filter that kept only the platform
        register_vllm_kernels()  # vLLM's CPU attention and GEMM kernels for our ops, on vLLM's CPU platform only
        self.spec = spec
        self.layer_name = spec.prefix
        self.num_heads, self.num_kv_heads, self.head_size = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.head_size_v = spec.head_dim
        self.sliding_window = spec.sliding_window
        self.kv_cache_dtype = spec.kv_cache_dtype
        self.kv_cache_torch_dtype = kv_cache_dtype_str_to_dtype(spec.kv_cache_dtype, vllm_config.model_config)
        self.dtype = torch.get_default_dtype()
        self.attn_type = "decoder"
        self.kv_sharing_target_layer_name = None
        self.attn_backend = AtomAttentionBackend
        self.impl = AtomAttentionImpl(spec.num_heads, spec.head_dim, spec.scale, spec.num_kv_heads,
                                      sliding_window=spec.sliding_window, kv_cache_dtype=spec.kv_cache_dtype,
                                      prefix=spec.prefix)
        if vllm_config.model_config is not None:  # (a layer built outside an engine has none: no warm-up)
            self.impl.warm_bounds = (vllm_config.model_config.max_model_len,
                                     vllm_config.scheduler_config.max_num_batched_tokens)
        forward_ctx = vllm_config.compilation_config.static_forward_context
        if spec.prefix in forward_ctx:
            raise ValueError(f"duplicate attention layer name {spec.prefix!r} in vLLM's forward context")
        forward_ctx[spec.prefix] = self
        self.kv_cache = torch.tensor([])  # vLLM binds the real view (bind_kv_cache)
        # Per-tensor fp8 KV scales (1.0: atom-core checkpoints carry none); buffers follow .to(device).
        self.register_buffer("_k_scale", torch.ones((), dtype=torch.float32), persistent=False)
        self.register_buffer("_v_scale", torch.ones((), dtype=torch.float32), persistent=False)
        # Qwen3's q/k norm + rotary fused into our K/V write (forward_qk_norm_rope), wherever atom_kernels own the
        # cache's page format; not where vLLM's CPU kernels write and read the pages (cpu_kernels.py), nor for a
        # latent (MLA) cache, which has no per-head K to norm.
        device_type = current_platform.device_type
        self.fuses_qk_norm_rope = not spec.is_mla and all(
            dispatch.backend_for(op, device_type) != "provided" for op in FULL_ATTENTION_OPS)

    def forward(self, query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None) -> torch.Tensor:
        """query [T, heads*d], key/value [T, kv_heads*d] (None: already in the cache) → [T, heads*d]"""
        output = torch.empty_like(query)
        torch.ops.atom.vllm_attention(query, key, value, output, self.layer_name)
        return output

    def forward_qk_norm_rope(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, norm_rope: tuple) -> torch.Tensor:
        """Qwen3's q/k norm + rotary fused with the K/V write, then attention (the core's
        qk_norm_rope_attention_forward): query [T, heads, d], key/value [T, kv_heads, d] → [T, heads*d]."""
        q_weight, k_weight, eps, cos_sin_cache = norm_rope
        t = query.shape[0]
        dtype = torch.promote_types(q_weight.dtype, query.dtype)  # the fused op's query dtype
        output = torch.empty((t, self.num_heads * self.head_size), dtype=dtype, device=query.device)
        torch.ops.atom.vllm_qk_norm_rope_attention(query, key, value, positions, q_weight, k_weight, cos_sin_cache,
                                                   output, self.layer_name, eps)
        return output

    def get_attn_backend(self) -> type[AtomAttentionBackend]:
        return AtomAttentionBackend

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        common = dict(block_size=vllm_config.cache_config.block_size, num_kv_heads=self.num_kv_heads,
                      head_size=self.head_size, dtype=self.kv_cache_torch_dtype,
                      kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype))
        if self.spec.uses_sliding_window:
            return SlidingWindowSpec(sliding_window=self.spec.sliding_window, **common)
        return FullAttentionSpec(**common)
