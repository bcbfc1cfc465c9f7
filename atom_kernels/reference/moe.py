"""fused_moe: the experts of a mixture-of-experts layer, given each token's routing (torch reference).

Same arithmetic as transformers' MoE experts (Qwen3-MoE, DeepSeek-V2/V3): each chosen expert's
down(silu(gate(x)) * up(x)) is scaled by the token's routing weight (cast to the hidden dtype) and
summed over the token's experts in the hidden dtype, expert after expert in id order.

Expert parallelism: an expert id of -1 in topk_ids means "this pair's expert lives on another rank" (the MoE layer
maps global ids to local ones, -1 for the other ranks' experts); such a pair contributes nothing here, and the other
ranks' partial outputs supply it when the host sums them. Any other id outside [0, E) is an error.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def check_moe_args(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor) -> None:
    """Shapes: hidden [T, H], w13 [E, 2*I, H], w2 [E, H, I], topk_weights/topk_ids [T, K]."""
    if hidden.dim() != 2:
        raise ValueError(f"fused_moe: hidden must be [tokens, hidden], got {tuple(hidden.shape)}")
    t, h = hidden.shape
    if w13.dim() != 3 or w13.shape[2] != h or w13.shape[1] % 2:
        raise ValueError(f"fused_moe: w13 must be [experts, 2*intermediate, hidden={h}] (gate rows, then up "
                         f"rows), got {tuple(w13.shape)}")
    e, i = w13.shape[0], w13.shape[1] // 2
    if tuple(w2.shape) != (e, h, i):
        raise ValueError(f"fused_moe: w2 must be [experts={e}, hidden={h}, intermediate={i}], got {tuple(w2.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t or topk_ids.is_floating_point():
        raise ValueError(f"fused_moe: topk_ids must be int [tokens={t}, top_k], got {tuple(topk_ids.shape)} "
                         f"{topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise ValueError(f"fused_moe: topk_weights must be float {tuple(topk_ids.shape)} like topk_ids, got "
                         f"{tuple(topk_weights.shape)} {topk_weights.dtype}")


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
    """hidden [T, H]; w13 [E, 2*I, H] (gate rows then up rows); w2 [E, H, I]; topk_weights [T, K]
    (any float dtype); topk_ids [T, K] (int, in [0, E), or -1: an expert of another rank, skipped) → [T, H] in
    hidden's dtype: out[t] = sum over k with e = topk_ids[t, k] >= 0 of
    topk_weights[t, k] * w2[e] @ (silu(gate_e @ x) * (up_e @ x))."""
    check_moe_args(hidden, w13, w2, topk_weights, topk_ids)

    def expert(e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, w13[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, w2[e])

    return run_experts(hidden, w13.shape[0], topk_weights, topk_ids, expert)


def run_experts(hidden: torch.Tensor, num_experts: int, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                expert: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """sum over each token's experts of topk_weight * expert(e, rows of hidden routed to e) → [T, H], experts in
    id order, rows within an expert by k then token (transformers' order). Pairs with id -1 (an expert of another
    rank) are skipped; other ids outside [0, num_experts) raise."""
    out = torch.zeros_like(hidden)
    if hidden.shape[0] == 0:
        return out
    # (k, token) pairs, k-major: within an expert, rows come in transformers' order (by k, then token)
    flat = topk_ids.t().reshape(-1)
    bad = (flat < -1) | (flat >= num_experts)
    if bool(bad.any()):
        raise ValueError(f"fused_moe: topk_ids must lie in [0, {num_experts}), or be -1 for an expert of another "
                         f"rank (expert parallelism), got {int(flat[bad][0])}")
    local = flat >= 0
    order = torch.argsort(flat, stable=True)  # grouped by expert, the -1 pairs first
    counts = torch.bincount(flat[local], minlength=num_experts).tolist()
    tokens = order % hidden.shape[0]
    weights = topk_weights.t().reshape(-1)[order].to(hidden.dtype)
    start = flat.numel() - sum(counts)  # past the skipped -1 pairs
    for e, count in enumerate(counts):
        if count == 0:
            continue
        rows = slice(start, start + count)
        y = expert(e, hidden[tokens[rows]]) * weights[rows, None]
        out.index_add_(0, tokens[rows], y)
        start += count
    return out
