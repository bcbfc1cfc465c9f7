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

    positions: [num_tokens]; query: [num_tokens, num_heads, head_dim]; key: [num_tokens, kv_heads, head_dim], of
    query's dtype; cos_sin_cache: [max_position, rotary_dim] float32, cos in the first half, sin in the second.
    Returns new (query, key) in their input dtype (views of one tensor: query and key heads rotate together).
    """
    if key.dtype != query.dtype:
        raise ValueError(f"rotary: query {query.dtype} and key {key.dtype} must have one dtype")
    cos, sin = cos_sin_cache[positions.long()].unsqueeze(1).chunk(2, dim=-1)  # [T, 1, rot/2] each
    heads = query.shape[1]
    y = _apply(torch.cat((query, key), dim=1), cos, sin)  # [T, heads + kv_heads, head_dim]
    return y[:, :heads], y[:, heads:]


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = cos.shape[-1]
    x_rot, x_pass = x[..., : 2 * half], x[..., 2 * half :]
    rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    # transformers: x * cat(cos, cos) + rotated * cat(sin, sin), cos/sin cast to the activation dtype; here both
    # halves ([..., 2, half] views) broadcast against one copy of cos and sin: the same products and sums.
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)  # [T, 1, 1, rot/2]
    y = (x_rot.unflatten(-1, (2, half)) * cos + rotated.unflatten(-1, (2, half)) * sin).flatten(-2)
    return torch.cat((y, x_pass), dim=-1) if x_pass.numel() else y
