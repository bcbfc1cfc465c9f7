"""FP8 (e4m3) weights and activations: per-token-group activation quantization and the scaled GEMMs (torch
reference: quantize the activation as the checkpoint says, dequantize both sides, matmul in float32).

Weight scales come in one layout for every checkpoint format: weight [N, K] float8_e4m3fn with weight_scale
[N, ceil(K / block_k)] float32, the scale of row n over columns [j * block_k, (j + 1) * block_k). A 128x128 block
format stores each block's scale once per row of the block; per-channel is block_k = K (one column); per-tensor
repeats one value. Rows are rows: fused QKV / gate-up shards and tensor-parallel row slices need no block alignment.

Activations: act_group > 0 quantizes each token's groups of act_group columns with their own scale (amax / 448,
DeepSeek's and vLLM's per-token-group rule; act_group = K is per-token); input_scale (a [1] tensor) quantizes
with that static per-tensor scale instead; act_group 0 and no input_scale leaves the activation as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from atom_kernels.reference.moe import run_experts

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
MIN_SCALE_AMAX = 1e-10  # an all-zero group gets a tiny scale, not a division by zero


def fp8_quantize(x: torch.Tensor, group: int, input_scale: torch.Tensor | None = None):
    """x [..., K] → (q [..., K] float8_e4m3fn, scale float32): per token and group of `group` columns (the last
    group may be partial), scale [..., ceil(K / group)]; with input_scale, that static scale ([1]) for all."""
    if input_scale is not None:
        scale = input_scale.float().reshape(1)
        return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
    k = x.shape[-1]
    pad = -k % group
    groups = F.pad(x.float(), (0, pad)).unflatten(-1, (-1, group))  # [..., G, group]
    scale = groups.abs().amax(-1, keepdim=True).clamp(min=MIN_SCALE_AMAX) / FP8_MAX
    q = (groups / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).flatten(-2)[..., :k]
    return q, scale.squeeze(-1)


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """q [..., K] fp8, scale [..., ceil(K / group)] (or [1]) → float32 [..., K]."""
    if scale.numel() == 1:
        return q.float() * scale.float().reshape(())
    return q.float() * scale.float().repeat_interleave(group, dim=-1)[..., : q.shape[-1]]


def _activation(x: torch.Tensor, act_group: int, input_scale: torch.Tensor | None) -> torch.Tensor:
    """x as the GEMM sees it: quantized and dequantized (float32) when the scheme quantizes activations."""
    if input_scale is None and act_group == 0:
        return x.float()
    group = act_group or x.shape[-1]
    q, scale = fp8_quantize(x, group, input_scale)
    return fp8_dequantize(q, scale, group)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_k: int, act_group: int,
               input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               block_n: int = 0) -> torch.Tensor:
    """x [..., K] (model dtype), weight [N, K] fp8, weight_scale [N, ceil(K / block_k)] → [..., N] in x's dtype,
    computed in float32 on the dequantized weight and the (quantized) activation (see the module doc). block_n: the
    caller's word that weight_scale's rows are constant over each aligned group of block_n rows (0: no such word);
    it only lets kernels read the scales per block, so the reference, which reads every row, ignores it."""
    w = fp8_dequantize(weight, weight_scale, block_k)
    y = F.linear(_activation(x, act_group, input_scale), w, None if bias is None else bias.float())
    return y.to(x.dtype)


def fp8_fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor,
                  w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, block_k: int,
                  act_group: int) -> torch.Tensor:
    """fused_moe on fp8 experts: w13 [E, 2I, H] / w2 [E, H, I] float8_e4m3fn with scales [E, 2I, ceil(H / block_k)]
    / [E, H, ceil(I / block_k)]; each expert's two GEMMs quantize their input per token group (act_group)."""
    def expert(e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = fp8_linear(x, w13[e], w13_scale[e], block_k, act_group).chunk(2, dim=-1)
        return fp8_linear(F.silu(gate) * up, w2[e], w2_scale[e], block_k, act_group)

    return run_experts(hidden, w13.shape[0], topk_weights, topk_ids, expert)
