"""Ops broken on purpose, registered through the dispatcher's public `register()`: a parity test that still
passes with one of them in place checks nothing (test_canary.py; `pytest --break-op NAME` for any test).

Each break replaces one op as the device's first choice (its "provided" kernel) and as the torch reference (what a
compiler traces). The broken fused prologues are made of the dispatched unfused ops, so they can be captured in
CUDA graphs as the real one is."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from atom_kernels import dispatch, rms_norm, rotary, write_kv_cache


def attention_zeros(query, *args, out=None, **kwargs) -> torch.Tensor:
    """paged_attention that attends to nothing."""
    if out is None:
        return torch.zeros_like(query)
    return out.zero_()


def kv_write_nothing(*args, **kwargs) -> None:
    """write_kv_cache that stores nothing."""


def rotary_identity(positions, query, key, cos_sin_cache):
    """rotary that rotates nothing."""
    return query, key


def fused_write_nothing(positions, query, key, value, q_weight, k_weight, eps, cos_sin_cache, *cache_args):
    """The fused Qwen3 prologue, but its KV write stores nothing."""
    return rotary(positions, rms_norm(query, q_weight, eps), rms_norm(key, k_weight, eps), cos_sin_cache)[0]


def fused_rotary_identity(positions, query, key, value, q_weight, k_weight, eps, cos_sin_cache,
                          k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    """The fused Qwen3 prologue, but without rotary."""
    write_kv_cache(rms_norm(key, k_weight, eps), value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return rms_norm(query, q_weight, eps)


def mla_attention_zeros(query, cache, block_tables, seq_lens, query_start_loc, scale, kv_lora_rank, cache_scale=None,
                        out=None, plan_cache=None, **hints) -> torch.Tensor:
    """mla_attention that attends to nothing."""
    if out is None:
        return query.new_zeros(*query.shape[:2], kv_lora_rank)
    return out.zero_()


def latent_write_nothing(*args, **kwargs) -> None:
    """write_latent_cache that stores nothing."""


def experts_zeros(hidden, *args) -> torch.Tensor:
    """fused_moe whose experts contribute nothing."""
    return torch.zeros_like(hidden)


def sample_too_hot(logits, temperature, seeds) -> torch.Tensor:
    """sample_tokens at twice each row's temperature (greedy rows stay greedy)."""
    if logits.is_cuda:
        from atom_kernels.triton.sampling import sample_tokens
    else:
        from atom_kernels.reference import sample_tokens
    return sample_tokens(logits, temperature * 2, seeds)


# break name → [(op, replacement)]: the plain path and the fused Qwen3 prologue broken alike. BREAKS hold the
# ops every full-attention model runs (test_canary.py breaks each under every scenario); MOE_BREAKS those only
# MoE models run, MLA_BREAKS those only MLA (DeepSeek) models run; SAMPLING_BREAKS change only what rows at a
# temperature > 0 draw (greedy parity cannot see them: test_graph_sampling.py's distribution checks do).
BREAKS = {
    "attention": [("paged_attention", attention_zeros)],
    "kv_write": [("write_kv_cache", kv_write_nothing), ("fused_qk_norm_rope_write_kv", fused_write_nothing)],
    "rotary": [("rotary", rotary_identity), ("fused_qk_norm_rope_write_kv", fused_rotary_identity)],
}
MOE_BREAKS = {"fused_moe": [("fused_moe", experts_zeros)]}
MLA_BREAKS = {"mla_attention": [("mla_attention", mla_attention_zeros)],
              "latent_write": [("write_latent_cache", latent_write_nothing)]}
SAMPLING_BREAKS = {"sample_temperature": [("sample_tokens", sample_too_hot)]}
ALL_BREAKS = {**BREAKS, **MOE_BREAKS, **MLA_BREAKS, **SAMPLING_BREAKS}


@contextlib.contextmanager
def broken(name: str, device_type: str = "cuda" if torch.cuda.is_available() else "cpu") -> Iterator[None]:
    """Within the block, break `name` (an ALL_BREAKS key) for the backend each op runs on `device_type`, eager
    and traced by a compiler (dispatch.COMPILER_FUSES ops trace as the torch reference). Eager calls get the break
    as their "provided" kernel, the first choice (before atom_kernels' own "cpu" and "triton" kernels), so an
    engine built inside the block runs it too."""
    restore = []
    try:
        for op, fn in ALL_BREAKS[name]:
            target = f"{__name__}:{fn.__name__}"
            restore.append((op, "provided", *(dispatch.provided_kernel(op) or (None, None))))
            dispatch.register(op, "provided", target, device_type=device_type)
            restore.append((op, "torch", dispatch.register(op, "torch", target), None))  # traced calls
        yield
    finally:
        for op, backend, previous, device in reversed(restore):  # previous None: the op had no provided kernel
            dispatch.register(op, backend, previous, device_type=device)
