"""An fp8 linear layer with its input op in front, the activation quantization fused into that op: RMSNorm (+ residual
add) → quantize → fp8 GEMM, SiLU-and-mul → quantize → fp8 GEMM (atom_kernels.rms_norm_fp8_linear and
silu_and_mul_fp8_linear). The norm or activation kernel writes e4m3 values and per-group scales instead of its
model-dtype output, so a layer launches one kernel before its GEMM instead of two (the op, then fp8_quantize_rows):
three launches fewer per decoder layer (qkv, gate_up, down), and the model-dtype activation is neither written nor
read back.

Values are those of the two ops: the norm or activation output is rounded to the model dtype exactly where the
separate kernel rounds it (norm.rms_scale, activation.py), then quantized per group of block_k columns as
fp8_quantize_rows does (fp8_quant.store_groups). The GEMM is fp8_linear.py's choice for the same M (GEMV, cuBLAS or
the tile kernel), with the scales in the layout it takes. Inputs fp8_linear.py leaves to the reference (another
scheme, a static input scale), a norm weight of another dtype and non-contiguous inputs run the two ops (the
reference, atom_kernels.reference.fused_linear).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.reference import fused_linear as composite
from atom_kernels.triton import fp8_linear as linear
from atom_kernels.triton._utils import pdl, pdl_prologue, pow2
from atom_kernels.triton.activation import silu_mul
from atom_kernels.triton.fp8_quant import scale_buffer, store_groups
from atom_kernels.triton.norm import rms_norm_row

SILU_BLOCK = 1024  # columns a SiLU-and-mul program quantizes (a multiple of every block_k fp8_linear takes)
ROW_MAX = 16384  # per-token groups: the widest row (a power of two) one program quantizes; wider runs the two ops


@triton.jit
def _rms_norm_quant_kernel(x_ptr, r_ptr, w_ptr, q_ptr, s_ptr, res_out_ptr, eps, N, ss_m, ss_g, BLOCK: tl.constexpr,
                           GROUP: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr):
    # One program per row: x, r, res_out [M, N] contiguous, w [N]; q [M, N] e4m3, s [M, cdiv(N, GROUP)] at strides
    # (ss_m, ss_g). BLOCK = pow2(N) >= GROUP: the whole row (the norm needs its sum of squares first).
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    y = rms_norm_row(x_ptr + row * N, r_ptr + row * N, w_ptr, res_out_ptr + row * N, eps, N, BLOCK, HAS_RESIDUAL,
                     x_ptr.dtype.element_ty)  # masked columns: 0
    store_groups(y, q_ptr + row * N, s_ptr + row * ss_m, ss_g, 0, N, BLOCK, GROUP)


@triton.jit
def _silu_and_mul_quant_kernel(x_ptr, q_ptr, s_ptr, D, ss_m, ss_g, BLOCK: tl.constexpr, GROUP: tl.constexpr,
                               PDL: tl.constexpr):
    # grid (M, cdiv(D, BLOCK)): x [M, 2D] contiguous (gate | up) → q [M, D] e4m3, s [M, cdiv(D, GROUP)] at strides
    # (ss_m, ss_g); a program quantizes BLOCK columns of one row (the groups are independent).
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < D
    g = tl.load(x_ptr + row * 2 * D + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * D + D + offs, mask=mask, other=0.0).to(tl.float32)
    y = silu_mul(g, u, x_ptr.dtype.element_ty).to(tl.float32)
    store_groups(y, q_ptr + row * D, s_ptr + row * ss_m, ss_g, start, D, BLOCK, GROUP)


def rms_norm_quantize(x, residual, weight, eps: float, group: int, m_major: bool):
    """x [M, N] contiguous (+ residual [M, N]) → (q [M, N] e4m3, scales [M, cdiv(N, group)] (m_major: strides (1, M)),
    x + residual or x): fp8_quantize_rows(rms_norm(x + residual)) in one launch."""
    m, n = x.shape
    q = torch.empty(m, n, dtype=torch.float8_e4m3fn, device=x.device)
    s = scale_buffer(m, triton.cdiv(n, group), m_major, x.device)
    res_out = x if residual is None else torch.empty_like(x)
    block = max(pow2(n), group)
    _rms_norm_quant_kernel[(m,)](x, x if residual is None else residual, weight, q, s, res_out, float(eps), n,
                                 *s.stride(), BLOCK=block, GROUP=_group(group, n, block),
                                 HAS_RESIDUAL=residual is not None,
                                 num_warps=min(16, max(1, block // 512)), **pdl(x.device))
    return q, s, res_out


def silu_and_mul_quantize(x, group: int, m_major: bool):
    """x [M, 2D] contiguous → (q [M, D] e4m3, scales [M, cdiv(D, group)]): fp8_quantize_rows(silu_and_mul(x))."""
    m, d = x.shape[0], x.shape[1] // 2
    q = torch.empty(m, d, dtype=torch.float8_e4m3fn, device=x.device)
    s = scale_buffer(m, triton.cdiv(d, group), m_major, x.device)
    block = pow2(d) if group >= d else max(min(pow2(d), SILU_BLOCK), group)  # a per-token group: the whole row
    warps = min(16, max(block // 256, 4)) if block >= 512 else 1
    _silu_and_mul_quant_kernel[(m, triton.cdiv(d, block))](x, q, s, d, *s.stride(), BLOCK=block,
                                                          GROUP=_group(group, d, block), num_warps=warps,
                                                          **pdl(x.device))
    return q, s


def _group(group: int, n: int, block: int) -> int:
    """The kernels' GROUP for quantization groups of `group` columns of an n-column row held in blocks of `block`:
    one group over the whole row (group >= n, per token) is the block (its masked columns are zeros)."""
    return block if group >= n else group


def _fits(x, weight, weight_scale, block_k, act_group, input_scale, *rows) -> bool:
    """fp8_linear.py runs the GEMM, and x and `rows` (residual, norm weight or None) are contiguous in x's dtype."""
    return (input_scale is None and linear.runs_here(x, weight, weight_scale, block_k, act_group, input_scale)
            and x.is_contiguous()
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and all(t is None or (t.dtype == x.dtype and t.is_contiguous()) for t in rows))


def rms_norm_fp8_linear(x, residual, norm_weight, eps, weight, weight_scale, block_k, act_group, input_scale=None,
                        bias=None, block_n=0):
    """The reference's contract (atom_kernels.reference.fused_linear)."""
    k = weight.shape[1]
    if not (_fits(x, weight, weight_scale, block_k, act_group, input_scale, residual, norm_weight)
            and x.shape[-1] == k and (residual is None or residual.shape == x.shape)):
        return composite.rms_norm_fp8_linear(x, residual, norm_weight, eps, weight, weight_scale, block_k, act_group,
                                             input_scale, bias, block_n)
    x2, bias = x.view(-1, k), None if bias is None else bias.contiguous()
    kernel = linear.path(x2, weight, block_k, bias, block_n)
    xq, xs, res = rms_norm_quantize(x2, None if residual is None else residual.view(-1, k), norm_weight, eps, block_k,
                                    m_major=kernel == "cublas")
    y = linear.matmul(kernel, xq, xs, weight, weight_scale, block_k, bias, x.dtype)
    return y.view(*x.shape[:-1], weight.shape[0]), res.view(x.shape)


def silu_and_mul_fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale=None, bias=None, block_n=0):
    """The reference's contract (atom_kernels.reference.fused_linear)."""
    k = weight.shape[1]
    if not (_fits(x, weight, weight_scale, block_k, act_group, input_scale) and x.shape[-1] == 2 * k
            and (block_k < k or pow2(k) <= ROW_MAX)):
        return composite.silu_and_mul_fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale, bias,
                                                 block_n)
    x2, bias = x.view(-1, 2 * k), None if bias is None else bias.contiguous()
    kernel = linear.path(x2[:, :k], weight, block_k, bias, block_n)
    xq, xs = silu_and_mul_quantize(x2, block_k, m_major=kernel == "cublas")
    y = linear.matmul(kernel, xq, xs, weight, weight_scale, block_k, bias, x.dtype)
    return y.view(*x.shape[:-1], weight.shape[0])
