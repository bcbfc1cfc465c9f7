"""What the FP8 benchmarks (fp8_gemm.py, moe.py --fp8) share: block quantization of random weights as the fp8
checkpoints store them, and the peers' FP8 kernels (torch's scaled GEMMs, vLLM's block-FP8 GEMMs and fused MoE),
each found at run time; a peer this machine lacks comes back as None with the reason, which the scripts print.

Layouts: a checkpoint's block scales are [ceil(N / 128), ceil(K / 128)] per weight (vLLM, torch take them so);
atom-core's layers repeat them over each block's rows, [N, ceil(K / 128)] (docs/fp8.md): rows_layout.
"""

from __future__ import annotations

import functools
import inspect

import torch

FP8 = torch.float8_e4m3fn
BLOCK = 128


def block_quantize(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] float → (e4m3 [..., N, K], scales [..., ceil(N / block), ceil(K / block)] float32), scale =
    amax / 448 per block x block tile (DeepSeek's weight_scale_inv)."""
    *lead, n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    tiles = torch.nn.functional.pad(w.float(), (0, kb * block - k, 0, nb * block - n))
    tiles = tiles.reshape(*lead, nb, block, kb, block)
    scale = tiles.abs().amax((-3, -1)).clamp(min=1e-12) / 448.0  # [..., nb, kb]
    q = (tiles / scale[..., :, None, :, None]).clamp(-448, 448).to(FP8).reshape(*lead, nb * block, kb * block)
    return q[..., :n, :k].contiguous(), scale


def rows_layout(scale: torch.Tensor, n: int, block: int = BLOCK) -> torch.Tensor:
    """Block scales [..., ceil(N / block), KB] → atom-core's [..., N, KB] (each block's scale on each of its rows)."""
    return scale.repeat_interleave(block, -2)[..., :n, :].contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Block-quantized [..., N, K] → float32."""
    n, k = q.shape[-2:]
    return q.float() * scale.repeat_interleave(block, -2)[..., :n, :].repeat_interleave(block, -1)[..., :k]


def rowwise_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] → (e4m3, float32 [M, 1]): one scale per row (per token / per output channel)."""
    scale = w.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (w.float() / scale).clamp(-448, 448).to(FP8), scale


def torch_blockwise_mm(device: str = "cuda"):
    """(fn(xq [M, K], xs [M, K/128], wq [N, K], ws [N/128, K/128]) → bf16 [M, N], description), or (None, reason):
    torch's blockwise-scaled GEMM (1x128 activation, 128x128 weight scales), tried in its known spellings on a small
    problem and kept only if it matches float32 on the dequantized operands."""
    import torch.nn.functional as F

    def v2(xq, xs, wq, ws):  # torch >= 2.10: F.scaled_mm with scale recipes; scale_b padded to 4 K-blocks
        l4 = -(-ws.shape[1] // 4) * 4
        sb = torch.zeros(ws.shape[0], l4, device=ws.device)
        sb[:, : ws.shape[1]] = ws
        return F.scaled_mm(xq, wq.t(), xs.t().contiguous().t(), F.ScalingType.BlockWise1x128, sb.t(),
                           F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)

    def v1(xq, xs, wq, ws):  # torch 2.8-2.9: _scaled_mm infers blockwise scaling from the scale shapes
        return torch._scaled_mm(xq, wq.t(), scale_a=xs.t().contiguous().t(), scale_b=ws.t(),
                                out_dtype=torch.bfloat16)

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(256, 512, device=device, generator=g)
    wq, ws = block_quantize(torch.randn(384, 512, device=device, generator=g))
    from atom_kernels.reference.fp8 import fp8_quantize

    xq, xs = fp8_quantize(x, BLOCK)
    want = (xq.float() * xs.repeat_interleave(BLOCK, -1)) @ dequantize(wq, ws).t()
    errors = []
    for name, fn in (("F.scaled_mm BlockWise1x128 x BlockWise128x128", v2), ("torch._scaled_mm blockwise", v1)):
        try:
            err = ((fn(xq, xs, wq, ws).float() - want).abs().max() / want.abs().max()).item()
        except Exception as e:  # noqa: BLE001 - the reason is reported
            errors.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        if err < 2e-2:
            return fn, name
        errors.append(f"{name}: wrong result (max rel err {err:.2e})")
    return None, "; ".join(errors)


def vllm_block_gemms() -> tuple[dict, str]:
    """({name: fn(x bf16 [M, K], wq [N, K], ws [N/128, K/128]) → bf16 [M, N]}, note): vLLM's block-FP8 linear
    kernels with their own activation quantization (per_token_group_quant_fp8), as its linear layers call them."""
    try:
        from vllm.model_executor.layers.quantization.utils import fp8_utils
    except Exception as e:  # noqa: BLE001
        return {}, f"vllm not importable ({type(e).__name__}: {str(e).splitlines()[0][:100]})"
    quant = fp8_utils.per_token_group_quant_fp8
    if "use_ue8m0" in inspect.signature(quant).parameters:
        # vLLM 0.32 may default to power-of-two (UE8M0) activation scales, rounded down, as its DeepGEMM path takes
        # them (with weights requantized to match); the Triton and CUTLASS GEMMs timed here take float32 scales
        # (H200 2026-11-29 without this: both vLLM rows 4e-2 off the reference, "WRONG"; not yet re-run).
        quant = functools.partial(quant, use_ue8m0=False)
    triton_mm = getattr(fp8_utils, "w8a8_triton_block_scaled_mm", None) or fp8_utils.w8a8_block_fp8_matmul
    fns = {"vllm triton": functools.partial(_triton_call, triton_mm, quant)}
    try:
        from vllm import _custom_ops as ops

        def cutlass(x, wq, ws):
            xq, xs = quant(x, BLOCK, column_major_scales=True)
            return ops.cutlass_scaled_mm(xq, wq.t(), out_dtype=torch.bfloat16, scale_a=xs, scale_b=ws.t())

        fns["vllm cutlass"] = cutlass
    except Exception as e:  # noqa: BLE001
        return fns, f"vllm cutlass_scaled_mm not importable ({type(e).__name__})"
    import vllm

    return fns, f"vllm {vllm.__version__}"


def _triton_call(mm, quant, x, wq, ws):
    xq, xs = quant(x, BLOCK)
    return mm(xq, wq, xs, ws, [BLOCK, BLOCK], torch.bfloat16)


def vllm_fp8_fused_moe():
    """(fn(x, w13q, w2q, s13 [E, 2I/128, H/128], s2 [E, H/128, I/128], weights, ids int32) → [T, H], note) or
    (None, reason): vLLM's Triton fused MoE on block-FP8 experts (dynamic per-token-group activations), either API."""
    try:
        from vllm.model_executor.layers.fused_moe import fused_moe as fm
    except Exception as e:  # noqa: BLE001
        return None, f"vllm not importable ({type(e).__name__}: {str(e).splitlines()[0][:100]})"
    try:
        from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config
    except ImportError:  # vLLM before the quant_config API (<= 0.10)
        def run(x, w13, w2, s13, s2, weights, ids):
            return fm.fused_experts(x, w13, w2, weights, ids, use_fp8_w8a8=True, w1_scale=s13,
                                    w2_scale=s2, block_shape=[BLOCK, BLOCK])
        return run, "vllm fused_experts(use_fp8_w8a8=True, block_shape=[128, 128])"

    def run(x, w13, w2, s13, s2, weights, ids):
        cfg = fp8_w8a8_moe_quant_config(w1_scale=s13, w2_scale=s2, block_shape=[BLOCK, BLOCK])
        return fm.fused_experts(x, w13, w2, weights, ids, quant_config=cfg)
    return run, "vllm fused_experts(quant_config=fp8_w8a8_moe_quant_config(block_shape=[128, 128]))"
