"""atom_kernels: the ops atom-core's layers call, each dispatched per device (see dispatch.py)."""

from __future__ import annotations

import torch

from atom_kernels import dispatch


def write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """Store K/V [T, kv_heads, d] into paged caches [blocks, block_size, kv_heads, d] at slot_mapping."""
    dispatch.get("write_kv_cache", key.device)(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def paged_attention(
    query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
    sliding_window=None, k_scale=None, v_scale=None, out=None, **hints,
) -> torch.Tensor:
    """Varlen causal attention over paged KV; see atom_kernels.reference.attention for the contract.

    `hints` (max_query_len, max_seq_len, num_decodes, ...) let GPU kernels size their grids without
    a device sync; every backend takes `plan_cache` (a per-step dict, see AttentionMetadata.plan_cache), the
    reference only that.
    """
    fn = dispatch.get("paged_attention", query.device)
    args = (query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)
    kwargs = dict(sliding_window=sliding_window, k_scale=k_scale, v_scale=v_scale, out=out)
    backend = dispatch.backend("paged_attention", query.device)
    kwargs["plan_cache"] = hints.pop("plan_cache", None)
    if backend != "torch":
        kwargs.update(hints)
    return fn(*args, **kwargs)


def write_latent_cache(latent, cache, slot_mapping, scale=None) -> None:
    """Store MLA latent rows [T, r + rope] into a paged latent cache [blocks, block_size, r + rope] at
    slot_mapping (-1 = padding); `scale`: the per-tensor scale of an fp8 cache."""
    dispatch.get("write_latent_cache", latent.device)(latent, cache, slot_mapping, scale)


def mla_attention(query, cache, block_tables, seq_lens, query_start_loc, scale, kv_lora_rank,
                  cache_scale=None, out=None, plan_cache=None, **hints) -> torch.Tensor:
    """Absorbed MLA over a paged latent cache: query [T, heads, r + rope] → [T, heads, r]; see
    atom_kernels.reference.mla for the contract. `hints` as for paged_attention, and decode_metadata (the step's
    MLADecodeMetadata where the host made it), for the GPU kernels only."""
    fn = dispatch.get("mla_attention", query.device)
    kwargs = hints if dispatch.backend("mla_attention", query.device) != "torch" else {}
    return fn(query, cache, block_tables, seq_lens, query_start_loc, scale, kv_lora_rank, cache_scale, out,
              plan_cache, **kwargs)


def mla_kv_indices(block_tables, seq_lens, block_size, kv_indptr, kv_indices) -> None:
    """Paged KV indices in CSR form (page ids), written in place: see atom_kernels.reference.mla."""
    dispatch.get("mla_kv_indices", seq_lens.device)(block_tables, seq_lens, block_size, kv_indptr, kv_indices)


def fused_qk_norm_rope_write_kv(
    positions, query, key, value, q_weight, k_weight, eps, cos_sin_cache,
    k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None,
) -> torch.Tensor:
    """Qwen3 prologue in one op: per-head RMSNorm of query [T, heads, d] and key [T, kv_heads, d], neox
    rotary, then (key, value) written into the paged caches at slot_mapping. Returns the query."""
    fn = dispatch.get("fused_qk_norm_rope_write_kv", query.device)
    return fn(positions, query, key, value, q_weight, k_weight, eps, cos_sin_cache,
              k_cache, v_cache, slot_mapping, k_scale, v_scale)


def pack_linear(weight, bias=None):
    """What `linear`'s kernel on weight's device wants besides weight [out, in] and bias [out] (e.g. a prepacked
    host GEMM), made once after loading; None when it wants nothing (the reference). Pass it to every call."""
    return dispatch.get("pack_linear", weight.device)(weight, bias)


def linear(x, weight, bias=None, packed=None):
    """x [..., in] @ weight[out, in]^T + bias → [..., out]; `packed`: pack_linear(weight, bias)'s answer."""
    return dispatch.get("linear", x.device)(x, weight, bias, packed)


def rms_norm_linear(x, residual, norm_weight, eps, weight, bias=None, packed=None):
    """linear(rms_norm(x + residual)) and x + residual (residual None: x): one kernel where the device has one."""
    return dispatch.get("rms_norm_linear", x.device)(x, residual, norm_weight, eps, weight, bias, packed)


def silu_and_mul_linear(x, weight, bias=None, packed=None):
    """[..., 2K] (gate | up) → linear(silu(gate) * up): one kernel where the device has one."""
    return dispatch.get("silu_and_mul_linear", x.device)(x, weight, bias, packed)


def rms_norm_fp8_linear(x, residual, norm_weight, eps, weight, weight_scale, block_k, act_group, input_scale=None,
                        bias=None, block_n=0):
    """rms_norm_linear for an fp8 weight (fp8_linear's arguments): (fp8_linear(rms_norm(x + residual)), x +
    residual), the activation quantized inside the norm's kernel where the device has one."""
    return dispatch.get("rms_norm_fp8_linear", x.device)(x, residual, norm_weight, eps, weight, weight_scale, block_k,
                                                         act_group, input_scale, bias, block_n)


def silu_and_mul_fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale=None, bias=None, block_n=0):
    """silu_and_mul_linear for an fp8 weight (fp8_linear's arguments), the activation quantized inside the SiLU's
    kernel where the device has one."""
    return dispatch.get("silu_and_mul_fp8_linear", x.device)(x, weight, weight_scale, block_k, act_group,
                                                             input_scale, bias, block_n)


def fp8_quantize(x, group, input_scale=None):
    """x [..., K] → (float8_e4m3fn [..., K], float32 scales [..., ceil(K / group)]) per token and group of `group`
    columns; with input_scale ([1]): that static scale. See atom_kernels.reference.fp8."""
    return dispatch.get("fp8_quantize", x.device)(x, group, input_scale)


def _fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale=None, bias=None, block_n=0):
    return dispatch.get("fp8_linear", x.device)(x, weight, weight_scale, block_k, act_group, input_scale, bias,
                                                block_n)


def sample_tokens(logits, temperature, seeds):
    """One token per row of logits [N, V]: argmax where temperature [N] float32 is 0, else a draw from
    softmax(logits / t) by Gumbel-max with Philox noise keyed by seeds [N] int64 → [N] int64. No device sync."""
    return dispatch.get("sample_tokens", logits.device)(logits, temperature, seeds)


def rms_norm(x, weight, eps, residual=None):
    """RMSNorm over the last dim; with residual returns (normed(x + residual), x + residual)."""
    return dispatch.get("rms_norm", x.device)(x, weight, eps, residual)


def rotary(positions, query, key, cos_sin_cache):
    """Neox-style rotary on [T, heads, d] query/key with a [max_pos, rot_dim] cos|sin cache."""
    return dispatch.get("rotary", query.device)(positions, query, key, cos_sin_cache)


def silu_and_mul(x):
    """[..., 2d] → silu(x[..., :d]) * x[..., d:]."""
    return dispatch.get("silu_and_mul", x.device)(x)


def _fp8_fused_moe(hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, block_k, act_group):
    return dispatch.get("fp8_fused_moe", hidden.device)(hidden, w13, w2, w13_scale, w2_scale, topk_weights,
                                                        topk_ids, block_k, act_group)


def _fused_moe(hidden, w13, w2, topk_weights, topk_ids):
    return dispatch.get("fused_moe", hidden.device)(hidden, w13, w2, topk_weights, topk_ids)


# fused_moe, fp8_fused_moe and fp8_linear are torch library ops, opaque to a compiler tracing the model (vLLM compiles
# with fullgraph=True): the MoE reference groups tokens by expert with CPU-side counts, the Triton launchers size their
# grids in Python and read cached device properties; traced, fp8_linear's reference would dequantize the whole weight
# in every step, where the op runs the Triton GEMM on the e4m3 weight. Library
# registration (not torch.library.custom_op): a few µs per eager call instead of ~20.
_LIB = torch.library.Library("atom_kernels", "FRAGMENT")
_LIB.define("fused_moe(Tensor hidden, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids) -> Tensor")
_LIB.impl("fused_moe", _fused_moe, "CompositeExplicitAutograd")
_LIB.define("fp8_fused_moe(Tensor hidden, Tensor w13, Tensor w2, Tensor w13_scale, Tensor w2_scale, "
            "Tensor topk_weights, Tensor topk_ids, int block_k, int act_group) -> Tensor")
_LIB.impl("fp8_fused_moe", _fp8_fused_moe, "CompositeExplicitAutograd")
for _op in ("fused_moe", "fp8_fused_moe"):
    torch.library.register_fake(f"atom_kernels::{_op}", lambda hidden, *args: torch.empty_like(hidden), lib=_LIB)
_LIB.define("fp8_linear(Tensor x, Tensor weight, Tensor weight_scale, int block_k, int act_group, "
            "Tensor? input_scale=None, Tensor? bias=None, int block_n=0) -> Tensor")
_LIB.impl("fp8_linear", _fp8_linear, "CompositeExplicitAutograd")
torch.library.register_fake("atom_kernels::fp8_linear",
                            lambda x, weight, *args, **kwargs: x.new_empty(*x.shape[:-1], weight.shape[0]),
                            lib=_LIB)


def fused_moe(hidden, w13, w2, topk_weights, topk_ids):
    """MoE experts: hidden [T, H], w13 [E, 2*I, H] (gate then up), w2 [E, H, I], routing topk_weights /
    topk_ids [T, K] → sum over each token's experts of weight * down(silu(gate) * up): [T, H].
    An id of -1 means the pair's expert lives on another rank (expert parallelism): the pair contributes nothing
    (the reference raises on other ids outside [0, E); the Triton kernels drop them, a check would sync)."""
    return torch.ops.atom_kernels.fused_moe(hidden, w13, w2, topk_weights, topk_ids)


def fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale=None, bias=None, block_n=0):
    """x [..., K] @ dequantized weight [N, K] (float8_e4m3fn, scales [N, ceil(K / block_k)])^T (+ bias) → [..., N],
    the activation quantized per token group of act_group columns (0: not at all) or with the static input_scale.
    block_n: 128 when weight_scale's rows are constant over every aligned 128-row group (the checkpoint's 128x128
    blocks, whole in this weight: atom_core.layers.fp8.row_block), so a kernel may read one scale row per block;
    0 (always safe) otherwise."""
    return torch.ops.atom_kernels.fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale, bias, block_n)


def fp8_fused_moe(hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, block_k, act_group):
    """fused_moe on float8_e4m3fn experts: w13 [E, 2I, H] / w2 [E, H, I] with scales [E, 2I, ceil(H / block_k)] /
    [E, H, ceil(I / block_k)], each GEMM's input quantized per token group of act_group columns (0: not at all).
    topk_ids as fused_moe's: -1 skips a pair whose expert is on another rank."""
    return torch.ops.atom_kernels.fp8_fused_moe(hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids,
                                                block_k, act_group)


__all__ = [
    "dispatch", "write_kv_cache", "paged_attention", "fused_qk_norm_rope_write_kv", "rms_norm", "rotary",
    "silu_and_mul", "fused_moe", "write_latent_cache", "mla_attention", "mla_kv_indices", "linear", "pack_linear",
    "rms_norm_linear", "silu_and_mul_linear", "sample_tokens", "fp8_quantize", "fp8_linear", "fp8_fused_moe",
    "rms_norm_fp8_linear", "silu_and_mul_fp8_linear",
]
