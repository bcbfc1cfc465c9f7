"""Rotary embeddings with the rope types transformers defines: default, linear, dynamic, yarn, llama3.

One cos|sin table per model, computed once in float32 for positions 0..max_model_len-1
([max_model_len, rotary_dim]: cos in the first half, sin in the second) and applied by
atom_kernels.rotary. No host passes a position >= max_model_len: the native engine, vLLM and
SGLang each cap a sequence at the length limit they hand us as AtomConfig.max_model_len (vLLM's
max_model_len, SGLang's context_len).

`dynamic` (NTK): transformers recomputes its frequencies on each forward from the largest
position seen so far (growing past max_position_embeddings, resetting below it), while the keys
already in its KV cache keep the frequencies they were rotated with; the result depends on how a
sequence was fed. We evaluate transformers' own formula once, at
seq_len = max(max_model_len, max_position_embeddings), i.e. the table of
`ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=that)`, for every position. So:
- max_model_len <= max_position_embeddings: the unscaled base; equal to transformers for every
  sequence the engine accepts (transformers never scales a sequence of that length);
- max_model_len > max_position_embeddings: every position (below max_position_embeddings too)
  uses the base scaled for max_model_len; equal to transformers' model with its rotary frozen at
  seq_len=max_model_len, not to its per-call update.

Rope parameters are read from transformers 5 `rope_parameters` or 4.x `rope_theta` + `rope_scaling`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

import atom_kernels

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """transformers 5 `rope_parameters`, or 4.x `rope_theta` + `rope_scaling`, as one dict in 5's form."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    for key, value in scaling.items():
        params.setdefault(key, value)
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(hf_config, "rope_theta", 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    # transformers 5 fills the pretraining length into the dict; 4.x falls back to max_position_embeddings.
    if params["rope_type"] in ("yarn", "llama3") and not params.get("original_max_position_embeddings"):
        params["original_max_position_embeddings"] = hf_config.max_position_embeddings
    return params


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(inv_freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def yarn_mscale(scale: float, m: float = 1.0) -> float:
    """Yarn's magnitude correction for a context extended `scale` times (DeepSeek's yarn_get_mscale)."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _yarn(base: float, dim: int, p: dict[str, Any], max_pos: int) -> tuple[torch.Tensor, float]:
    factor = p.get("factor") or max_pos / p["original_max_position_embeddings"]
    orig = p["original_max_position_embeddings"]

    attn = p.get("attention_factor")
    if attn is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attn = float(yarn_mscale(factor, m) / yarn_mscale(factor, m_all)) if m and m_all else yarn_mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, attn


def compute_inv_freq(p: dict[str, Any], dim: int, max_pos_embeddings: int, context_len: int):
    """(inv_freq [dim/2] float32, attention_scaling) for rope parameters `p`."""
    rope_type, base = p["rope_type"], p["rope_theta"]
    if rope_type == "default":
        return _base_inv_freq(base, dim), 1.0
    if rope_type == "linear":
        return _base_inv_freq(base, dim) / p["factor"], 1.0
    if rope_type == "llama3":
        return _llama3(_base_inv_freq(base, dim), p), 1.0
    if rope_type == "dynamic":  # evaluated once for the engine's context (see the module docstring)
        seq_len = max(context_len, max_pos_embeddings)
        factor = p["factor"]
        base = base * ((factor * seq_len / max_pos_embeddings) - (factor - 1)) ** (dim / (dim - 2))
        return _base_inv_freq(base, dim), 1.0
    if rope_type == "yarn":
        return _yarn(base, dim, p, max_pos_embeddings)
    raise ValueError(f"rope_type={rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, rotary_dim: int, max_model_len: int, params: dict[str, Any],
                 max_position_embeddings: int) -> None:
        super().__init__()
        self.head_dim, self.rotary_dim = head_dim, rotary_dim
        inv_freq, scaling = compute_inv_freq(params, rotary_dim, max_position_embeddings, max_model_len)
        t = torch.arange(max_model_len, dtype=torch.float32)
        freqs = t[:, None] * inv_freq[None, :]  # [max_model_len, rot/2]
        cache = torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions [T] (each < max_model_len); q [T, heads, head_dim]; k [T, kv_heads, head_dim] → (q, k)."""
        return atom_kernels.rotary(positions, q, k, self.cos_sin_cache)


def get_rope(hf_config: Any, head_dim: int, max_model_len: int) -> RotaryEmbedding:
    """The model's one rotary table, for positions 0..max_model_len-1 (every layer shares it)."""
    params = rope_parameters(hf_config)
    partial = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0))
    max_pos_emb = getattr(hf_config, "max_position_embeddings", None) or max_model_len
    return RotaryEmbedding(head_dim, int(head_dim * partial), max_model_len, params, max_pos_emb)
