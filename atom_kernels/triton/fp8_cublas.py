"""fp8_linear at large M through torch's scaled GEMMs: our Triton activation quantizer, then for the block format
torch's blockwise-scaled GEMM (F.scaled_mm with 1x128 activation and 128x128 weight scales: cuBLASLt's DeepSeek-style
scaling, which torch runs on sm_90 only, cuBLASLt >= 12.9), for per-channel weights with per-token activations its
rowwise one (F.scaled_mm with RowWise scales: a [M, 1] and a [1, N] vector, the weight_scale [N, 1] as it is;
`scaled_mm_rowwise`). fp8_linear.py decides when (its `path`); this module says whether the device and this torch
build can (`fits`, `fits_rowwise`, from one probe per device, dtype and recipe) and makes the call.

Layouts torch checks (aten/src/ATen/native/cuda/ScaledBlas.cpp, _scaled_block1x128_block128x128):
  mat_a xq [M, K] e4m3, row-major;       scale_a [M, K / 128] float32 at strides (1, M)
  mat_b weight.t() [K, N] (our [N, K]); scale_b [L4, ceil(N / 128)] float32 at strides (1, L4), L4 = K / 128 rounded
        up to a multiple of 4: the transpose of a contiguous [ceil(N / 128), L4], the columns past K / 128 zero
  K and N multiples of 16; here K a multiple of 128 too (whole K blocks only, as the models' shapes have them).
The quantizer writes scale_a in that layout itself (fp8_quantize_rows(m_major=True)). scale_b is derived per call
from the layers' one scale layout, per row ([N, K / 128]): weight_scale[::128], one row per 128-row block, exact when
those rows are constant over each block (the op's block_n == 128, decided at load by atom_core.layers.fp8.row_block),
copied into the padded form: ceil(N / 128) * L4 floats (16 K, 64 KB, for DeepSeek-V3's gate_up), one small kernel.
The spelling is the one benchmarks/fp8_peers.py's torch_blockwise_mm measured on the H200 (torch 2.11).

Rounding: cuBLAS writes x's dtype directly (fast accumulation off), one rounding as in the reference. A bias goes
into cuBLAS' epilogue (torch takes one of the output dtype) when the probe shows it added before that rounding (a
case where adding it after gives another value); else biased calls keep the tile kernel. The probe also compares a
random problem with the reference (scales spread over 16x, so a misread layout fails), with N a multiple of 128 and
with a partial last block (N = 272), each allowed only if it passes.
No host sync and no data-dependent allocation per call (CUDA-graph capturable); the probe syncs, so it runs on the
first eager call (a call inside a capture before any probe takes the tile kernel and probes nothing).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from atom_kernels.reference import fp8 as reference
from atom_kernels.triton.fp8_quant import fp8_quantize_rows

BLOCK = 128  # the only block torch's blockwise scaled_mm takes (1x128 activation groups, 128x128 weight blocks)
DTYPES = (torch.bfloat16, torch.float16)
PROBE_TOL = 1e-2  # relative L2 of the probe's random problem; a misplaced or misread scale is off by tens of percent


class Support(NamedTuple):
    """What the probe found on one device for one dtype."""

    aligned: bool  # N a multiple of 128 matches the reference
    partial_n: bool  # so does N with a partial last 128-row block
    bias: bool  # the epilogue adds a bias before the one rounding
    note: str  # why not, when not


_SUPPORT: dict[tuple[int, torch.dtype, bool], Support] = {}


def support(device: torch.device, dtype: torch.dtype, rowwise: bool = False) -> Support:
    """The probe's answer for (device, dtype) and the blockwise or the rowwise GEMM (rowwise: partial_n == aligned,
    there are no row blocks), probed on first use (not inside a CUDA graph capture: the probe compares on the host;
    such a call answers "no" and leaves the probe for an eager call)."""
    key = (device.index if device.index is not None else torch.cuda.current_device(), dtype, rowwise)
    if key not in _SUPPORT:
        if torch.cuda.is_current_stream_capturing():
            return Support(False, False, False, "not probed yet (first call inside a CUDA graph capture)")
        _SUPPORT[key] = (_probe_rowwise if rowwise else _probe)(torch.device("cuda", key[0]), dtype)
    return _SUPPORT[key]


def fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether cublas_linear runs x [M, K] @ weight [N, K]^T (+ bias) exactly as the reference would (block_n ==
    block_k == 128 and a dynamically quantized activation: the caller's part)."""
    if not _operands_fit(x, weight, BLOCK):
        return False
    s = support(x.device, x.dtype)
    return s.aligned and (weight.shape[0] % BLOCK == 0 or s.partial_n) and _bias_fits(s, x, bias)


def fits_rowwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether scaled_mm_rowwise runs x [M, K] @ weight [N, K]^T (+ bias) exactly as the reference would (one scale
    over K per weight row and per token, dynamic: the caller's part)."""
    if not _operands_fit(x, weight, 16):
        return False
    s = support(x.device, x.dtype, rowwise=True)
    return s.aligned and _bias_fits(s, x, bias)


def _operands_fit(x: torch.Tensor, weight: torch.Tensor, k_multiple: int) -> bool:
    n, k = weight.shape
    return (x.device.type == "cuda" and x.dtype in DTYPES and k % k_multiple == 0 and n % 16 == 0
            and weight.data_ptr() % 16 == 0)


def _bias_fits(s: Support, x: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return bias is None or (s.bias and bias.dtype == x.dtype and bias.data_ptr() % 16 == 0)


def cublas_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] contiguous (bf16 / fp16) → [M, N] in x's dtype; weight [N, K] e4m3, weight_scale [N, K / 128] constant
    over each 128-row block; bias [N] in x's dtype or None."""
    xq, xs = fp8_quantize_rows(x, BLOCK, m_major=True)
    return scaled_mm(xq, xs, weight, block_scales(weight_scale), bias, x.dtype)


def block_scales(weight_scale: torch.Tensor) -> torch.Tensor:
    """weight_scale [N, KB] (rows constant over each 128-row block) → scale_b: [L4, ceil(N / 128)] at strides
    (1, L4), L4 = KB rounded up to a multiple of 4, the padding zero."""
    kb = weight_scale.shape[1]
    l4 = -(-kb // 4) * 4
    blocks = weight_scale.new_empty(-(-weight_scale.shape[0] // BLOCK), l4)  # fresh: strides (l4, 1) at any size
    if l4 > kb:
        blocks[:, kb:].zero_()
    blocks[:, :kb].copy_(weight_scale[::BLOCK])
    return blocks.t()


def scaled_mm(xq, xs, weight, scale_b, bias, dtype) -> torch.Tensor:
    """The one spelling of the call (torch >= 2.10): xq [M, K] e4m3, xs [M, K / 128] at strides (1, M), weight
    [N, K] e4m3, scale_b from block_scales."""
    return F.scaled_mm(xq, weight.t(), xs, F.ScalingType.BlockWise1x128, scale_b, F.ScalingType.BlockWise128x128,
                       bias=bias, output_dtype=dtype)


def scaled_mm_rowwise(xq, xs, weight, weight_scale, bias, dtype) -> torch.Tensor:
    """xq [M, K] e4m3 with xs [M, 1] (per token), weight [N, K] e4m3 with weight_scale [N, 1] (per channel), both
    contiguous, → [M, N] in dtype: torch's rowwise scaled GEMM (scale_b taken as [1, N])."""
    return F.scaled_mm(xq, weight.t(), xs, F.ScalingType.RowWise, weight_scale.view(1, -1), F.ScalingType.RowWise,
                       bias=bias, output_dtype=dtype)


def _missing(device: torch.device, recipe: str) -> str:
    """Why this GPU or torch build has no F.scaled_mm with the scaling `recipe` (a ScalingType name); "" if it has."""
    if torch.version.hip is not None or torch.cuda.get_device_capability(device) < (9, 0):
        return "needs an NVIDIA GPU of sm_90 or later"
    if not hasattr(F, "scaled_mm") or not hasattr(getattr(F, "ScalingType", None), recipe):
        return f"torch {torch.__version__} has no F.scaled_mm with {recipe}"
    return ""


def _probe(device: torch.device, dtype: torch.dtype) -> Support:
    if why := _missing(device, "BlockWise128x128"):
        return Support(False, False, False, why)
    aligned, note = _attempt(_matches, device, dtype, 256)
    if not aligned:
        return Support(False, False, False, note)
    partial, partial_note = _attempt(_matches, device, dtype, 272)
    bias, bias_note = _attempt(_bias_rounds_once, device, dtype)
    return Support(True, partial, bias, "; ".join(n for n in (partial_note, bias_note) if n))


def _attempt(check, *args) -> tuple[bool, str]:
    """(check(*args), why not): an error from torch's checks or cuBLAS counts as a no, with its first line."""
    what = f"{check.__name__}({', '.join(map(str, args[1:]))})"
    try:
        ok = check(*args)
    except (RuntimeError, ValueError, TypeError) as e:  # torch's checks; NotImplementedError is a RuntimeError
        return False, f"{what}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return ok, "" if ok else f"{what}: differs from the reference"


def _matches(device: torch.device, dtype: torch.dtype, n: int, m: int = 40, k: int = 384) -> bool:
    """cublas_linear == the reference within PROBE_TOL (relative L2) on random operands whose activation groups and
    weight blocks have scales spread over 16x (a misread scale layout moves whole outputs)."""
    g = torch.Generator(device=device).manual_seed(0)
    spread = torch.randint(-2, 3, (m, k // BLOCK), generator=g, device=device).exp2().repeat_interleave(BLOCK, 1)
    x = (torch.randn(m, k, generator=g, device=device) * spread).to(dtype)
    wq = torch.randn(n, k, generator=g, device=device).to(reference.FP8)
    blocks = torch.randint(-2, 3, (-(-n // BLOCK), k // BLOCK), generator=g, device=device).exp2() / 64
    scale = blocks.repeat_interleave(BLOCK, 0)[:n].contiguous()
    got, want = cublas_linear(x, wq, scale, None).float(), reference.fp8_linear(x, wq, scale, BLOCK, BLOCK).float()
    return bool((got - want).norm() <= PROBE_TOL * want.norm())


def _bias_rounds_once(device: torch.device, dtype: torch.dtype, m: int = 40, n: int = 256) -> bool:
    """Every output is 1 + ulp/4 (two K blocks: 1 and 1 * ulp/4, exact in float32) plus a bias of ulp/2, ulp the
    dtype's spacing at 1: rounded once that is 1 + ulp (3/4 of a step up), the reference's value; rounded to the dtype
    first (to 1) and then after the add, a tie, to even: 1."""
    ulp = torch.finfo(dtype).eps
    ones = torch.zeros(max(m, n), 2 * BLOCK, device=device)
    ones[:, 0] = ones[:, BLOCK] = 1
    xq, wq = ones[:m].to(reference.FP8), ones[:n].to(reference.FP8)
    xs = torch.empty_strided((m, 2), (1, m), dtype=torch.float32, device=device)
    xs[:, 0], xs[:, 1] = 1, ulp / 4
    bias = torch.full((n,), ulp / 2, dtype=dtype, device=device)
    y = scaled_mm(xq, xs, wq, block_scales(torch.ones(n, 2, device=device)), bias, dtype)
    return bool((y == 1 + ulp).all())


def _probe_rowwise(device: torch.device, dtype: torch.dtype) -> Support:
    if why := _missing(device, "RowWise"):
        return Support(False, False, False, why)
    ok, note = _attempt(_rowwise_matches, device, dtype)
    if not ok:
        return Support(False, False, False, note)
    bias, bias_note = _attempt(_rowwise_bias_rounds_once, device, dtype)
    return Support(True, True, bias, bias_note)


def _rowwise_matches(device: torch.device, dtype: torch.dtype, m: int = 40, n: int = 272, k: int = 384) -> bool:
    """scaled_mm_rowwise after our per-token quantizer == the reference within PROBE_TOL (relative L2), token and
    channel scales spread over 16x (a scale applied to the wrong side or index moves whole outputs)."""
    g = torch.Generator(device=device).manual_seed(0)
    x = (torch.randn(m, k, generator=g, device=device)
         * torch.randint(-2, 3, (m, 1), generator=g, device=device).exp2()).to(dtype)
    wq = torch.randn(n, k, generator=g, device=device).to(reference.FP8)
    scale = torch.randint(-2, 3, (n, 1), generator=g, device=device).exp2() / 64
    xq, xs = fp8_quantize_rows(x, k)
    got = scaled_mm_rowwise(xq, xs, wq, scale, None, dtype).float()
    want = reference.fp8_linear(x, wq, scale, k, k).float()
    return bool((got - want).norm() <= PROBE_TOL * want.norm())


def _rowwise_bias_rounds_once(device: torch.device, dtype: torch.dtype, m: int = 40, n: int = 256) -> bool:
    """_bias_rounds_once for the rowwise GEMM: each product is 1 + ulp/4 (1 * 1 + 2^-6 * (ulp/4) / 2^-6, all
    e4m3 values, scales 1), the bias ulp/2; rounded once 1 + ulp, rounded before the add 1."""
    ulp, a = torch.finfo(dtype).eps, 2.0**-6
    x, w = torch.zeros(m, 32, device=device), torch.zeros(n, 32, device=device)
    x[:, 0], x[:, 1], w[:, 0], w[:, 1] = 1, a, 1, ulp / 4 / a
    ones = torch.ones(max(m, n), 1, device=device)
    bias = torch.full((n,), ulp / 2, dtype=dtype, device=device)
    y = scaled_mm_rowwise(x.to(reference.FP8), ones[:m], w.to(reference.FP8), ones[:n], bias, dtype)
    return bool((y == 1 + ulp).all())
