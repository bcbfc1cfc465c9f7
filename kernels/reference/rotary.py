"""Rotary position embedding (neox / rotate-half style, as transformers' Llama and Qwen3 use)."""

from __future__ import annotations

import torch


def rotary(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first rotary_dim features of every head.

    positions: [num_tokens]; query: [num_tokens, num_heads, head_dim]; key: [num_tokens, kv_heads, head_dim]
    cos_sin_cache: [max_position, rotary_dim] float32, cos in the first half, sin in the second.
    Returns new (query, key) in their input dtypes.
    """
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)  # [T, rot/2] each
    cos = torch.cat((cos, cos), dim=-1).unsqueeze(1)
    sin = torch.cat((sin, sin), dim=-1).unsqueeze(1)
    return _apply(query, cos, sin), _apply(key, cos, sin)


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rot_dim = cos.shape[-1]
    x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
    half = rot_dim // 2
    rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    # transformers casts cos/sin to the activation dtype before multiplying.
    y = x_rot * cos.to(x.dtype) + rotated * sin.to(x.dtype)
    return torch.cat((y, x_pass), dim=-1) if x_pass.numel() else y
