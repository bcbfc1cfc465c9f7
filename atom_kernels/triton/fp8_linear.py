"""fp8_linear for the fp8 block format (weight scales per 128 columns, activations per token and group of the same
128 columns) and for per-channel weights with per-token activations (compressed-tensors "FP8-Dynamic": one scale
over all of K on each side, block_k = act_group = K): a scaled GEMM over e4m3 operands, by M (`path` decides):
  - M <= GEMV_MAX_M (32): the weight-streaming GEMV of fp8_gemv.py (split-K, swapped tensor-core products);
  - M >= cublas_min_m(K) (33 for K >= 7168, else 256: CUBLAS_MIN_M), a bf16 / fp16 activation, no bias or one the
    library adds before its one rounding, on a GPU where torch's scaled_mm was found to match the reference (sm_90),
    fp8_cublas.py: per channel, torch's rowwise scaled_mm; the block format with block_n == block_k == 128 (the
    layer's rows are whole 128-row blocks, so one scale row per block says it all), cuBLAS' blockwise GEMM. On the
    H200 the latter ran DeepSeek-V3's layers at M = 4096 in 0.49-0.61x the tile kernel's time
    (benchmarks/results/fp8_gemm-2026-11-29-NVIDIA-H200-cublas.txt);
  - else the tile kernel here: float32 activations, fused layers or tensor-parallel slices whose row blocks start
    mid-way (block_n 0), other block sizes, K not a multiple of 128, other GPUs.

The tile kernel: both scales are constant over one K block, so each block's partial product factors: y[m, n] =
sum_b xs[m, b] * ws[n, b] * sum_{k in b} xq[m, k] * wq[n, k]. A program owns a BLOCK_M x BLOCK_N tile of y, walks K
one scale block at a time (BLOCK_K = block_k; per channel, 128-column tiles under the one scale: fp8_gemv.k_tiles),
takes the tile's dot product of the e4m3 tiles (fp8 tensor cores on sm_89+; elsewhere and for tiles under 32 columns,
of the tiles converted to float16, exact: every e4m3 value is a float16), with float32 accumulation, and adds it times
the outer product of the two scale vectors; the bias is added in float32 and the tile stored once in the model dtype
(as the reference rounds). Tiles by M bucket: GEMM_TILES. Every path quantizes the activation first with
fp8_quantize_rows (bit-equal to the reference's fp8_quantize).

A static per-tensor input_scale (compressed-tensors' static activations) takes the same paths: the activation
quantized as the reference does, its one scale repeated where a dynamic one would be (`quantize`). Everything else
(another activation group, no activation quantization) runs the torch reference. A compiler tracing the model never
enters here: atom_kernels.fp8_linear is a torch library op, opaque to it. Tested against it under Triton's CPU
interpreter (tests/kernels/test_triton_fp8_linear_interpreter.py) and, marked gpu, at DeepSeek-V3 / Qwen3-30B-A3B
shapes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from atom_kernels.reference import fp8 as reference
from atom_kernels.triton import fp8_cublas
from atom_kernels.triton._utils import check, nvidia_sm90, pdl, pdl_prologue
from atom_kernels.triton.attention.decode import num_sms
from atom_kernels.triton.fp8_gemv import GEMV_MAX_M, gemv_quantized, k_tiles
from atom_kernels.triton.fp8_quant import fp8_quantize_rows, scale_buffer, use_fp8_dot


@triton.jit
def _block_scaled_gemm(xq_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, M, N, K, KB, KT, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ONE_SCALE: tl.constexpr, GROUP_M: tl.constexpr,
                       FP8_DOT: tl.constexpr, TMA: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    # grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),); xq [M, K], w [N, K] e4m3 (K-contiguous); xs [M, KB], ws [N, KB] fp32;
    # b [N] (HAS_BIAS); y [M, N] in the model dtype, rounded once after the float32 bias add as the reference does.
    # KT K tiles of BLOCK_K columns; tile b has scale column b, or 0 for all (ONE_SCALE: per channel, KB = 1).
    # TMA: xq_ptr / w_ptr are tensor descriptors of [BLOCK_M, BLOCK_K] / [BLOCK_N, BLOCK_K] boxes (the copy engine
    # fills rows and columns past the tensor with zeros), else plain pointers with masked loads.
    # Programs in groups of GROUP_M row tiles, row tile fastest inside a group: the programs running together share
    # a few weight column tiles and GROUP_M activation row tiles in L2 (GROUP_M >= the row tiles: row tile fastest).
    pid, num_m, num_n = tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    first_m = pid // (GROUP_M * num_n) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + pid % (GROUP_M * num_n) % size_m
    pid_n = pid % (GROUP_M * num_n) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(0, KT):
        if TMA:
            a = xq_ptr.load([pid_m * BLOCK_M, b * BLOCK_K])
            w = w_ptr.load([pid_n * BLOCK_N, b * BLOCK_K])
        else:
            kk = b * BLOCK_K + rk
            a = tl.load(xq_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            w = tl.load(w_ptr + rn[:, None] * K + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)
        if FP8_DOT:
            part = tl.dot(a, tl.trans(w), out_dtype=tl.float32)
        else:
            part = tl.dot(a.to(tl.float16), tl.trans(w.to(tl.float16)), out_dtype=tl.float32)
        sb = 0 if ONE_SCALE else b
        xs = tl.load(xs_ptr + rm * KB + sb, mask=rm < M, other=0.0)
        ws = tl.load(ws_ptr + rn * KB + sb, mask=rn < N, other=0.0)
        acc += part * xs[:, None] * ws[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


# (BLOCK_M, BLOCK_N, num_warps, num_stages, GROUP_M) by M bucket, first match (M <= GEMV_MAX_M takes fp8_gemv.py).
# BLOCK_K is the scale block (128), so a stage is (BLOCK_M + BLOCK_N) * 128 bytes of e4m3: 24 KB at 64 x 128, four
# stages 96 KB of an H200 SM's 228 KB (two programs an SM). One warpgroup (4 warps) owns a 64 x 128 tile; BLOCK_N is
# halved while the grid is under one program an SM. Chosen by `benchmarks/fp8_gemm.py --sweep` on the H200 (TMA loads,
# 2026-11-29, benchmarks/results/fp8_gemm-2026-11-29-NVIDIA-H200-tma.txt): 64 x 128, 4 warps, 4 stages was the fastest
# on DeepSeek-V3's gate_up at M = 4096 (629 TFLOP/s against 556 for 128 x 128 with 8 warps) and o at M = 256 (123 us
# against 165), within 7% of the fastest on Qwen3-30B-A3B's qkv at 256 and 4096.
GEMM_TILES = ((64, (64, 64, 4, 4, 8)), (None, (64, 128, 4, 4, 8)))
# From which M up cuBLAS' blockwise GEMM (fp8_cublas.py) runs where it fits, by K (smallest K, smallest M); below, the
# tile kernel. The H200 crossover (benchmarks/fp8_gemm.py's "ours: tile" vs "ours: cublas" at M 40..4096, 2026-11-29,
# benchmarks/results/fp8_gemm-2026-11-29-NVIDIA-H200-cublas.txt): with K >= 7168 cuBLAS was 1.05-2.06x faster at
# every M above the GEMV's (DeepSeek-V3's fused_qkv_a, o, gate_up, down, shared gate_up); with K <= 4096 the tile
# kernel was faster up to M = 64-128 (cuBLAS 0.61-0.89x: DeepSeek-V3's q_b and shared down, Qwen3-30B-A3B's qkv, o),
# even at 256 (0.66-1.49x) and slower at 4096 (cuBLAS 1.05-1.64x).
CUBLAS_MIN_M = ((7168, GEMV_MAX_M + 1), (0, 256))


def cublas_min_m(k: int) -> int:
    return next(m for min_k, m in CUBLAS_MIN_M if k >= min_k)


def gemm_tiles(m: int, n: int, sms: int) -> tuple[int, int, int, int, int]:
    """GEMM_TILES' entry for m rows, BLOCK_N halved (to >= 64) while the grid has fewer programs than `sms` SMs."""
    block_m, block_n, warps, stages, group_m = next(tiles for top, tiles in GEMM_TILES if top is None or m <= top)
    while block_n > 64 and triton.cdiv(m, block_m) * triton.cdiv(n, block_n) < sms:
        block_n //= 2
    return block_m, block_n, warps, stages, group_m


def runs_here(x, weight, weight_scale, block_k, act_group, input_scale) -> bool:
    """Whether the kernels here take these inputs (weight scale blocks of block_k columns: 16 to 256, or all of K,
    i.e. per channel; the activation quantized dynamically in groups of block_k columns, or with one static
    per-tensor input_scale; rows and columns to compute), else the reference; a weight_scale of the wrong shape is
    an error."""
    n, k = weight.shape
    static = input_scale is not None and act_group == 0 and input_scale.numel() == 1
    if not ((static or (input_scale is None and act_group == block_k))
            and (block_k >= k or block_k in (16, 32, 64, 128, 256))
            and weight.is_contiguous() and weight_scale.is_contiguous()):
        return False
    kb = -(-k // block_k)
    check(tuple(weight_scale.shape) == (n, kb), f"fp8_linear: weight_scale must be [{n}, {kb}], got "
                                                f"{tuple(weight_scale.shape)}")
    return x.numel() > 0 and n > 0


def fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale=None, bias=None, block_n=0):
    """The contract of atom_kernels.reference.fp8.fp8_linear: x [..., K] → [..., N] in x's dtype."""
    if not runs_here(x, weight, weight_scale, block_k, act_group, input_scale):
        return reference.fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale, bias)
    n, k = weight.shape
    x2, bias = x.reshape(-1, k).contiguous(), None if bias is None else bias.contiguous()
    kernel = path(x2, weight, block_k, bias, block_n)
    xq, xs = quantize(x2, block_k, weight_scale.shape[1], input_scale, m_major=kernel == "cublas")
    return matmul(kernel, xq, xs, weight, weight_scale, block_k, bias, x.dtype).reshape(*x.shape[:-1], n)


def quantize(x, block_k: int, kb: int, input_scale, m_major: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] → the activation as the GEMMs take it, (xq [M, K] e4m3, xs [M, KB] float32, strides (1, M) when
    m_major): quantized per token and group of block_k columns (fp8_quantize_rows), or with the static per-tensor
    input_scale as the reference does (its division and cast: a few elementwise launches) and that scale repeated
    over every row and K block, so each path reads it where it reads a dynamic scale."""
    if input_scale is None:
        return fp8_quantize_rows(x, block_k, m_major)
    xq, scale = reference.fp8_quantize(x, block_k, input_scale)
    xs = scale_buffer(x.shape[0], kb, m_major, x.device)
    xs.copy_(scale.expand(x.shape[0], kb))
    return xq, xs


def matmul(kernel: str, xq, xs, weight, weight_scale, block_k, bias, dtype) -> torch.Tensor:
    """The GEMM `kernel` (path's answer) of a quantized activation xq [M, K] e4m3 with its scales xs [M, KB] (at
    strides (1, M) for "cublas", else row-major) → [M, N] in dtype."""
    if kernel == "gemv":
        return gemv_quantized(xq, xs, weight, weight_scale, block_k, bias, dtype)
    if kernel == "cublas":
        return fp8_cublas.scaled_mm(xq, xs, weight, fp8_cublas.block_scales(weight_scale), bias, dtype)
    if kernel == "cublas_row":
        return fp8_cublas.scaled_mm_rowwise(xq, xs, weight, weight_scale, bias, dtype)
    return gemm_quantized(xq, xs, weight, weight_scale, block_k, bias, dtype)


def path(x, weight, block_k, bias, block_n) -> str:
    """The kernel fp8_linear runs x [M, K] (contiguous) on, for the inputs it keeps from the reference (runs_here):
    "gemv" (M <= GEMV_MAX_M); from M >= cublas_min_m(K) "cublas_row" (one scale over K: per channel and per token,
    fp8_cublas.fits_rowwise) or "cublas" (rows block-structured in 128x128 blocks and fp8_cublas.fits: device,
    dtype, shape, bias); else "tile"."""
    m, k = x.shape
    if m <= GEMV_MAX_M:
        return "gemv"
    if m >= cublas_min_m(k):
        if block_k >= k and fp8_cublas.fits_rowwise(x, weight, bias):
            return "cublas_row"
        if block_n == block_k == fp8_cublas.BLOCK and fp8_cublas.fits(x, weight, bias):
            return "cublas"
    return "tile"


def tma_loads(weight: torch.Tensor) -> bool:
    """Whether the tile kernel loads through the copy engine (TMA): NVIDIA sm_90+ (and the interpreter), with the
    16-byte aligned rows and base a descriptor needs (K % 16 == 0 for e4m3)."""
    aligned = weight.shape[1] % 16 == 0 and weight.data_ptr() % 16 == 0
    if weight.device.type == "cpu":
        return aligned
    return aligned and nvidia_sm90(torch.cuda.current_device() if weight.device.index is None else weight.device.index)


def gemm(x, weight, weight_scale, block_k, bias, tiles=None, tma=None):
    """x [M, K] contiguous → [M, N] in x's dtype through the tile kernel: the activation quantized, then
    gemm_quantized."""
    xq, xs = fp8_quantize_rows(x, block_k)
    return gemm_quantized(xq, xs, weight, weight_scale, block_k, bias, x.dtype, tiles, tma)


def gemm_quantized(xq, xs, weight, weight_scale, block_k, bias, dtype, tiles=None, tma=None):
    """xq [M, K] e4m3 with xs [M, KB] float32 row-major → [M, N] in dtype through the tile kernel; tiles: gemm_tiles'
    answer by default; tma: tma_loads' answer by default."""
    (m, k), n = xq.shape, weight.shape[0]
    y = torch.empty((m, n), dtype=dtype, device=xq.device)
    block_m, block_n, warps, stages, group_m = tiles or gemm_tiles(m, n, num_sms(xq.device))
    tma = tma_loads(weight) if tma is None else tma
    tile_k, tiles, one_scale = k_tiles(block_k, k)
    a, w = xq, weight
    if tma:
        a = TensorDescriptor.from_tensor(xq, [block_m, tile_k])
        w = TensorDescriptor.from_tensor(weight, [block_n, tile_k])
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _block_scaled_gemm[grid](a, xs, w, weight_scale, weight if bias is None else bias, y, m, n, k, xs.shape[1], tiles,
                             BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=tile_k, ONE_SCALE=one_scale, GROUP_M=group_m,
                             FP8_DOT=tile_k >= 32 and use_fp8_dot(xq.device, dtype), TMA=tma, HAS_BIAS=bias is not None,
                             num_warps=warps, num_stages=stages, **pdl(xq.device))
    return y
