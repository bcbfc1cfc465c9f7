"""Per-token-group e4m3 activation quantization in Triton, bit-equal to atom_kernels.reference.fp8.fp8_quantize.

The reference: scale = max(amax(group), 1e-10) / 448, q = e4m3(clamp(x / scale, -448, 448)), rounded to nearest
even. Two details make a kernel give the same bits:
  - IEEE division (tl.math.div_rn): Triton's `/` on fp32 is the approximate div.full.f32 on NVIDIA GPUs;
  - the rounding to e4m3 is done here in fp32 arithmetic (e4m3_round), so the cast only ever sees values e4m3
    holds exactly: then any conversion gives the same bits. (Triton 3.6's CPU interpreter converts fp32 to e4m3
    wrongly, e.g. 1.95 -> 1.0, 17 -> 18; hardware casts are RNE, so on a GPU this only costs a few ALU ops.)

fake_quant_rows (quantize then dequantize a register tile whose rows are each one group) is what the MoE GEMV
kernels use to quantize their activation tile in place; fp8_quantize_rows is the standalone kernel.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from atom_kernels.reference.fp8 import fp8_quantize as reference_fp8_quantize
from atom_kernels.triton._utils import check, pdl, pdl_prologue

FP8_MAX = tl.constexpr(448.0)
MIN_SCALE_AMAX = tl.constexpr(1e-10)  # as the reference: an all-zero group gets a tiny scale
QUANT_TILE = 4096  # elements a quantization program holds: 32 rows of a 128-column group (16 fp32 a thread at 4 warps)


@triton.jit
def e4m3_round(v):
    """v fp32 with |v| <= 448 → v rounded to the nearest e4m3 value (ties to even), still fp32.
    e4m3 keeps 3 mantissa bits and its smallest normal exponent is -6 (below: subnormals, steps of 2^-9), so the
    step at v is 2^(max(exponent(v), -6) - 3). Adding then subtracting M = 1.5 * 2^(step exponent + 23) makes the
    fp32 adder round v to a multiple of that step, ties to even (|v| < 2^(step exponent + 22) always holds)."""
    exp = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    step_exp = tl.maximum(exp, -6) - 3
    magic = (((step_exp + 150) << 23) | (1 << 22)).to(tl.float32, bitcast=True)
    return (v + magic) - magic


@triton.jit
def group_scale(amax):
    """The reference's scale for a group's amax (fp32): max(amax, 1e-10) / 448, IEEE-rounded."""
    return tl.math.div_rn(tl.maximum(amax, MIN_SCALE_AMAX), FP8_MAX)


@triton.jit
def quantize_values(x, scale):
    """x fp32 / scale (broadcastable) → the e4m3 values as exact fp32 (cast with .to(tl.float8e4nv))."""
    return e4m3_round(tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX, FP8_MAX))


@triton.jit
def fake_quant_rows(x):
    """x [R, C] fp32, each row one quantization group (masked-off columns 0) → its quantized values times the
    row's scale: exactly the dequantized activation the reference multiplies."""
    scale = group_scale(tl.max(tl.abs(x), axis=1))[:, None]
    return quantize_values(x, scale) * scale


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, s_ptr, M, K, G, GROUP, sx, ss_m, ss_g, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    # grid (cdiv(M, ROWS), G): x [M, K] (row stride sx) → q [M, K] e4m3, s [M, G] fp32 at strides (ss_m, ss_g): (G, 1)
    # row-major, (1, M) M-major (how torch's blockwise scaled_mm takes activation scales). A program owns ROWS rows of
    # group g, columns [g * GROUP, min((g + 1) * GROUP, K)), walked BLOCK at a time: amax first, then the
    # quantization (a group within one BLOCK is read from DRAM once; the second read hits L1/L2). ROWS rows per program,
    # not one: a 128-column group is 256 bytes, too little work for a program at M = 4096.
    pdl_prologue(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1)
    start = g * GROUP
    end = tl.minimum(start + GROUP, K)
    row_ok, rows = rows < M, rows.to(tl.int64)
    amax = tl.zeros([ROWS, BLOCK], tl.float32)
    for k0 in range(start, end, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        mask = row_ok[:, None] & (k < end)[None, :]
        x = tl.load(x_ptr + rows[:, None] * sx + k[None, :], mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = group_scale(tl.max(amax, axis=1))  # [ROWS]
    for k0 in range(start, end, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        mask = row_ok[:, None] & (k < end)[None, :]
        x = tl.load(x_ptr + rows[:, None] * sx + k[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(q_ptr + rows[:, None] * K + k[None, :], quantize_values(x, scale[:, None]).to(q_ptr.dtype.element_ty),
                 mask=mask)
    tl.store(s_ptr + rows * ss_m + g * ss_g, scale, mask=row_ok)


def use_fp8_dot(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the fp8 GEMMs take e4m3 tensor-core dots for a model of `dtype`: where the device has them, except
    float32 models, whose dots take the exact float16 form: Hopper's e4m3 MMAs accumulate with fewer bits than
    float32 (tests/kernels/test_triton_fp8_moe.py), which moved float32 greedy tokens of the FP8 parity checkpoints
    off transformers' at margins of 0.1-0.44 on the H100 (2026-12-07; with the float16 dots they matched)."""
    return dtype != torch.float32 and has_fp8_dot(device)


def has_fp8_dot(device: torch.device) -> bool:
    """e4m3 tl.dot: NVIDIA sm_89+ (and Triton's interpreter, on CPU tensors); ROCm's MI300 has only the fnuz e4m3."""
    return _has_fp8_dot(device.type, device.index)


@functools.cache
def _has_fp8_dot(device_type: str, index: int | None) -> bool:
    if device_type != "cuda":
        return True
    if torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(index) >= (8, 9)


@triton.jit
def store_groups(y, q_ptr, s_ptr, ss_g, start, n, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """Quantize a row's values y [BLOCK] fp32 at columns start + [0, BLOCK) (start a multiple of GROUP; columns >= n
    masked off, their y 0) in groups of GROUP columns, as the reference does: q at q_ptr + column, the scale of
    group g at s_ptr + g * ss_g. BLOCK a multiple of GROUP."""
    groups = tl.reshape(y, [BLOCK // GROUP, GROUP])
    scale = group_scale(tl.max(tl.abs(groups), axis=1))
    q = tl.reshape(quantize_values(groups, scale[:, None]), [BLOCK])
    offs = start + tl.arange(0, BLOCK)
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=offs < n)
    g = start // GROUP + tl.arange(0, BLOCK // GROUP)
    tl.store(s_ptr + g * ss_g, scale, mask=g * GROUP < n)


def scale_buffer(m: int, groups: int, m_major: bool, device: torch.device) -> torch.Tensor:
    """The activation scales' tensor [m, groups] float32: strides (1, m) when m_major, else (groups, 1)."""
    # empty_strided: a size-1 dim keeps the stride asked for (a transposed contiguous [G, M] would not at M = 1)
    strides = (1, m) if m_major else (groups, 1)
    return torch.empty_strided((m, groups), strides, dtype=torch.float32, device=device)


def fp8_quantize_rows(x: torch.Tensor, group: int, m_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (float, last dim contiguous) → (q [M, K] float8_e4m3fn, scale [M, ceil(K / group)] float32): the
    reference's fp8_quantize(x, group) for dynamic scales, in one launch, no host sync. m_major: the scale tensor
    has strides (1, M) (each group's M scales contiguous, as torch's blockwise scaled_mm takes them), else (G, 1)."""
    check(x.dim() == 2 and x.stride(-1) == 1 and group >= 1,
          f"fp8_quantize_rows: x must be [rows, K] with a contiguous last dim and group >= 1, got "
          f"{tuple(x.shape)} strides {x.stride()}, group {group}")
    m, k = x.shape
    g = triton.cdiv(k, group)
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scale = scale_buffer(m, g, m_major, x.device)
    strides = scale.stride()
    if m and k:
        block = min(triton.next_power_of_2(min(group, k)), 2048)
        rows = min(triton.next_power_of_2(m), max(1, QUANT_TILE // block))
        _quantize_kernel[(triton.cdiv(m, rows), g)](x, q, scale, m, k, g, group, x.stride(0), *strides, ROWS=rows,
                                                     BLOCK=block, num_warps=4 if rows * block > 256 else 1,
                                                     **pdl(x.device))
    return q, scale


def fp8_quantize(x: torch.Tensor, group: int, input_scale: torch.Tensor | None = None):
    """The op fp8_quantize (atom_kernels.fp8_quantize): x [..., K] → (q [..., K], scale [..., ceil(K / group)]).
    Dynamic scales in one launch (fp8_quantize_rows); a static input_scale is one division, the reference's."""
    if input_scale is not None:
        return reference_fp8_quantize(x, group, input_scale)
    q, scale = fp8_quantize_rows(x.reshape(-1, x.shape[-1]).contiguous(), group)
    return q.view(x.shape), scale.view(*x.shape[:-1], scale.shape[-1])
