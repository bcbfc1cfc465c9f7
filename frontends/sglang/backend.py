"""atom-core's SGLang attention backend (`--attention-backend atom`).

init_forward_metadata builds the core's AttentionMetadata with the builder the Attention factory
attached to the model's layers (for SGLang's own models, whose layers the core did not make:
metadata.py's); forward_extend/forward_decode run the shared `attention_forward` (atom_kernels) directly
on SGLang's token pool, in place. It serves atom-core's layers and SGLang's own RadixAttention layers.
With SGLang's MLA token pool (DeepSeek architectures) they run the shared `mla_forward` instead, on
the pool's latent buffer [slots, 1, r + rope]: block size 1, the same logical layout as our latent cache.
Built once the pool exists, the backend compiles our attention kernels' variants for every layer right away
(kernel_warmup), so that no serving step pays a Triton compile.
Decode batches take part in SGLang's decode CUDA graphs through persistent metadata buffers (graphs.py); the other
graphs SGLang captures either run our attention eagerly (breakable prefill graphs: attention is a graph break) or
are refused with advice (full prefill graphs, speculative decoding's, CPU graphs).
Imported only inside SGLang processes (it subclasses SGLang's AttentionBackend).
"""

from __future__ import annotations

import weakref

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType, RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

from atom_core.forward_context import AttentionMetadata
from atom_core.layers.attention import (
    AttentionSpec,
    attention_forward,
    metadata_builder_of,
    mla_forward,
    qk_norm_rope_attention_forward,
)
from atom_core.layers.kernel_warmup import AttentionCaches, warm_up
from atom_frontends.sglang.config import extend_token_budget
from atom_frontends.sglang.graphs import SEQ_LEN_FILL_VALUE, DecodeGraphBuffers, unsupported_graph
from atom_frontends.sglang.metadata import build_metadata

NAME = "atom"
CPU_GRAPH_ERROR = (
    "atom-core's SGLang attention backend does not take part in SGLang's CPU graphs (device=\"cpu\" with "
    "--enable-torch-compile): start SGLang on CPU without --enable-torch-compile, or use another --attention-backend"
)
_FLOAT_KV = (torch.float32, torch.bfloat16, torch.float16)


def spec_of(layer, mla: bool = False) -> AttentionSpec:
    """The AttentionSpec of an atom-core layer, or one derived from an SGLang RadixAttention (an MLA one,
    absorbed form, when the pool is SGLang's MLA pool: qk_head_dim = r + rope, v_head_dim = r)."""
    spec = getattr(layer, "spec", None)
    if isinstance(spec, AttentionSpec):
        if spec.is_mla != mla:
            raise NotImplementedError(f"{spec.prefix}: a {'latent (MLA)' if spec.is_mla else 'full'}-attention "
                                      f"layer over SGLang's {'MLA' if mla else 'MHA'} token pool")
        return spec
    if mla:
        return _mla_spec_of(layer)
    problems = []
    if layer.logit_cap and layer.logit_cap > 0:
        problems.append(f"logit capping ({layer.logit_cap})")
    if layer.is_cross_attention or layer.attn_type != AttentionType.DECODER:
        problems.append(f"non-causal attention ({layer.attn_type.value}, cross={layer.is_cross_attention})")
    if layer.qk_head_dim != layer.v_head_dim:
        problems.append(f"v_head_dim {layer.v_head_dim} != head_dim {layer.qk_head_dim}")
    if layer.use_irope:
        problems.append("chunked local attention (irope)")
    if problems:
        raise NotImplementedError(f"attention layer {layer.layer_id} uses {', '.join(problems)}, which "
                                  "atom-core's attention backend does not support yet; use another "
                                  "--attention-backend")
    # SGLang's window counts the keys before the query; ours includes the query.
    size = layer.sliding_window_size
    window = size + 1 if size is not None and size >= 0 else None
    return AttentionSpec(layer.tp_q_head_num, layer.qk_head_dim, layer.scaling, layer.tp_k_head_num,
                         prefix=f"sglang.layer{layer.layer_id}", sliding_window=window)


def _mla_spec_of(layer) -> AttentionSpec:
    """An SGLang RadixAttention over the MLA pool: one latent "head" of r + rope, values its first r."""
    r = layer.v_head_dim
    if layer.tp_k_head_num != 1 or not 0 < r < layer.qk_head_dim or (layer.logit_cap or 0) > 0:
        raise NotImplementedError(f"attention layer {layer.layer_id} over SGLang's MLA pool is not the absorbed "
                                  f"form atom-core's backend runs (kv heads {layer.tp_k_head_num}, qk_head_dim "
                                  f"{layer.qk_head_dim}, v_head_dim {r}, logit_cap {layer.logit_cap}); use "
                                  "another --attention-backend")
    return AttentionSpec(layer.tp_q_head_num, layer.qk_head_dim, layer.scaling, 1,
                         prefix=f"sglang.layer{layer.layer_id}", kv_lora_rank=r,
                         qk_rope_head_dim=layer.qk_head_dim - r)


class AtomAttnBackend(AttentionBackend):
    def __init__(self, model_runner) -> None:
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.mla = self._check_pool(self.token_to_kv_pool)
        self.context_len = model_runner.model_config.context_len
        ours = any(hasattr(m, "metadata_builder") for m in model_runner.model.modules())
        self.build_metadata = metadata_builder_of(model_runner.model.modules()) if ours else build_metadata
        self.forward_metadata: AttentionMetadata | None = None
        self.graph_buffers: DecodeGraphBuffers | None = None  # made by init_cuda_graph_state
        self._specs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._warm_up(model_runner)

    @staticmethod
    def _check_pool(pool) -> bool:
        """True for SGLang's MLA (latent) pool, False for its MHA pool; raises for any other."""
        if not isinstance(pool, (MHATokenToKVPool, MLATokenToKVPool)):
            raise NotImplementedError(f"atom-core's attention backend reads an MHATokenToKVPool or an "
                                      f"MLATokenToKVPool; this model uses {type(pool).__name__} (hybrid/"
                                      "sliding-window/quantized pools are not supported yet); use another "
                                      "--attention-backend")
        mla = isinstance(pool, MLATokenToKVPool)  # its FP4 subclass stores bytes: refused by the dtype check
        if mla and (pool.use_dsa or pool.kv_cache_dim != pool.kv_lora_rank + pool.qk_rope_head_dim):
            raise NotImplementedError("atom-core's attention backend reads a plain MLA pool (rows of "
                                      "kv_lora_rank + qk_rope_head_dim); sparse (DSA) MLA pools are not supported")
        if pool.dtype not in _FLOAT_KV or pool.store_dtype != pool.dtype:
            raise NotImplementedError(f"KV cache dtype {pool.dtype} is not supported by atom-core's "
                                      "attention backend yet; use --kv-cache-dtype auto")
        return mla

    def _warm_up(self, model_runner) -> None:
        """Run kernel_warmup's attention warm-up for every attention layer of the model, on its own part of the
        pool. Here because SGLang builds attention backends after the KV pool and before any graph capture or
        forward (init_attention_backends, then init_cuda_graphs): the first forward is a user's request. Bounds
        are SGLang's: its context length and the most tokens one extend step runs. No-op where the torch
        reference runs (CPU); a layer shape warms once per process (TBO or pdmux setups build several backends)."""
        context_len = model_runner.model_config.context_len
        budget = extend_token_budget(model_runner.server_args, context_len)
        dtype = model_runner.model_config.dtype  # the queries' dtype: the model's activations
        layers = [m for m in model_runner.model.modules() if isinstance(m, RadixAttention)]
        warm_up(dtype, context_len, budget,
                attention=[AttentionCaches(self._spec(layer), self._caches(layer)) for layer in layers])

    # --- metadata ---------------------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch) -> None:
        """Eager steps (extend, mixed, decode batches no graph serves, breakable prefill graphs' eager attention)."""
        self.forward_metadata = self.build_metadata(forward_batch, self.req_to_token_pool.req_to_token)

    # --- decode CUDA graphs (graphs.py has the protocol) ---------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.graph_buffers = DecodeGraphBuffers(max_bs, max_num_tokens, self.req_to_token_pool.req_to_token,
                                                self.mla, self.context_len)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return SEQ_LEN_FILL_VALUE

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        """Before a decode graph's capture (in_capture) and before each replay: the padded batch into the persistent
        buffers; the graph reads them. Only decode graphs: a full prefill graph (--cuda-graph-backend-prefill=full)
        or a speculative one is refused."""
        mode = forward_batch.forward_mode
        if not mode.is_decode():
            raise unsupported_graph(f"a {mode.name} graph")
        if self.graph_buffers is None:
            raise RuntimeError("atom attention backend: a decode graph before init_cuda_graph_state")
        self.forward_metadata = self.graph_buffers.refill(forward_batch)

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        """Starts each capture run (SGLang's warm-up run, then the captured one): per-step memos the previous run
        made (the decode launch order, ...) must be made again inside this one, so the graph recomputes them."""
        if self.forward_metadata is not None:
            self.forward_metadata.plan_cache.clear()

    def init_forward_metadata_for_breakable_cuda_graph_capture(self, forward_batch):
        # SGLang calls it only for backends with use_captured_forward_metadata_for_breakable_cuda_graph (not us):
        # under breakable prefill graphs our attention runs eagerly (a graph break) on init_forward_metadata's.
        raise unsupported_graph("captured metadata under breakable prefill graphs")

    # SGLang's CPUGraphRunner (device="cpu" with --enable-torch-compile) calls these.
    def init_cpu_graph_state(self, *args, **kwargs):
        raise RuntimeError(CPU_GRAPH_ERROR)

    def get_cpu_graph_seq_len_fill_value(self) -> int:
        # Not only CPU graphs read it: SGLang's CPU engine pads DP-attention batches (prepare_mlp_sync_batch) with it.
        return SEQ_LEN_FILL_VALUE

    def init_forward_metadata_capture_cpu_graph(self, *args, **kwargs):
        raise RuntimeError(CPU_GRAPH_ERROR)

    def support_triton(self) -> bool:
        return False

    # --- attention ------------------------------------------------------------------------------
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        return self._attend(q, k, v, layer, save_kv_cache, kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        return self._attend(q, k, v, layer, save_kv_cache, kwargs)

    def _spec(self, layer) -> AttentionSpec:
        spec = self._specs.get(layer)
        if spec is None:
            spec = self._specs[layer] = spec_of(layer, self.mla)
        return spec

    def _caches(self, layer) -> tuple[torch.Tensor, ...]:
        """The layer's part of the pool as the kernels' block-size-1 views, no copy: the MLA pool's latent buffer
        [slots, 1, r + rope] as it is; the MHA pool's [slots, pool_heads, d] K and V as [slots, 1, kv_heads, d],
        the first kv_heads (the layer's) of its heads (SGLang's CPU path sizes the pool from heads it padded up to
        the TP size: config._PADDED_HEADS; ours are the checkpoint's)."""
        pool, layer_id, kv_heads = self.token_to_kv_pool, layer.layer_id, layer.tp_k_head_num
        if self.mla:
            return (pool.get_key_buffer(layer_id),)
        k, v = pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id)
        if k.dim() != 3:
            raise NotImplementedError(f"KV buffer of shape {tuple(k.shape)} is not the token-major "
                                      "[slots, kv_heads, head_dim] layout atom-core reads "
                                      "(unset SGLANG_USE_HND_KVCACHE)")
        if k.shape[1] < kv_heads:
            raise RuntimeError(f"SGLang's KV pool holds {k.shape[1]} KV heads per rank for layer {layer_id}, "
                               f"atom-core's layer has {kv_heads}")
        return k[:, None, :kv_heads], v[:, None, :kv_heads]

    def _metadata(self, t: int) -> AttentionMetadata:
        md = self.forward_metadata
        if md is None or md.num_tokens != t:
            raise RuntimeError(f"atom attention backend: no metadata for this batch of {t} tokens "
                               "(init_forward_metadata was not called for it)")
        return md

    def forward_qk_norm_rope(self, layer, positions, query, key, value, norm_rope) -> torch.Tensor:
        """Qwen3's prologue fused into the K/V write, then attention (the core's qk_norm_rope_attention_forward),
        for SGLangAttention.forward_qk_norm_rope: query [T, heads, d], key/value [T, kv_heads, d] → [T, heads*d]."""
        k_cache, v_cache = self._caches(layer)
        return qk_norm_rope_attention_forward(self._spec(layer), positions, query, key, value, norm_rope, k_cache,
                                              v_cache, self._metadata(query.shape[0]))

    def _attend(self, q, k, v, layer, save_kv_cache: bool, kwargs: dict) -> torch.Tensor:
        """q [T, heads*d] (or [T, heads, d]); k/v [T, kv_heads, d] → [T, heads*d].
        MLA pool: q [T, heads, r + rope], k [T, 1, r + rope] (the rows to write), v [T, 1, r] → [T, heads*r]."""
        if any(value is not None for value in kwargs.values()):
            raise NotImplementedError(f"atom-core's attention backend got unsupported arguments "
                                      f"{sorted(kwargs)}")
        t = q.shape[0]
        md = self._metadata(t)
        spec = self._spec(layer)
        if self.mla:
            # v is k's first r features (SGLang's own models pass that view); the rows written are k's
            latent = k.reshape(t, spec.head_dim) if save_kv_cache and k is not None else None
            (cache,) = self._caches(layer)
            out = mla_forward(spec, q.reshape(t, spec.num_heads, spec.head_dim), latent, cache, md)
            return out.reshape(t, spec.num_heads * spec.kv_lora_rank)
        k_cache, v_cache = self._caches(layer)
        write = save_kv_cache and k is not None and v is not None
        key = k.reshape(t, -1) if write else None
        value = v.reshape(t, -1) if write else None
        return attention_forward(spec, q.reshape(t, -1), key, value, k_cache, v_cache, md)


def create_backend(model_runner) -> AtomAttnBackend:
    """The factory registered under NAME with SGLang's register_attention_backend."""
    return AtomAttnBackend(model_runner)
