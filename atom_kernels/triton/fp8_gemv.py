"""fp8_linear at small M (decode, M <= GEMV_MAX_M rows): the fp8 block format's GEMM as a weight-streaming GEMV.

Contract as atom_kernels.reference.fp8.fp8_linear with block_k == act_group (the caller, fp8_linear.py, checks):
x [M, K], weight [N, K] e4m3, weight_scale [N, KB] float32 (KB = ceil(K / block_k); the scale of row n over columns
[b * block_k, (b + 1) * block_k): a checkpoint's 128x128 block scale repeated over its block's rows), activation
quantized per token and block_k columns exactly as fp8_quantize_rows (bit-equal to the reference's fp8_quantize).

At M <= 32 the layer is a weight read: N * K bytes against 2 * M * N * K flops. On an H200 (~4.3 TB/s copy,
132 SMs) the goal is >= 0.7 of copy bandwidth, ~3 TB/s of weight. Hence:
  - one program owns BLOCK_N weight rows for ALL M rows and a range of K blocks, so the weight is read once;
  - split-K (grid axis 1) when N / BLOCK_N alone gives too few programs to keep ~2 per SM busy pulling bytes
    (N = 2048 / 64 = 32 programs would leave three quarters of 132 SMs idle);
  - the per-block product is a tensor-core dot with the weight tile as the MMA's M side ([BLOCK_N = 64, 128] e4m3,
    wgmma-sized) and the tokens, padded to 16 or 32, as its N side ("swap AB"): the padding costs tensor-core
    flops, which are ~30x the need at M = 32, not bytes. A CUDA-core product for M <= 4 was measured slower at
    every shape (H200: 0.05-0.17 of copy at M = 1 against 0.2-0.7 for the dot at M = 32; docs/fp8.md).
Each K block b adds (sum_k wq[n, k] * xq[m, k]) * ws[n, b] * xs[m, b] to a float32 accumulator, the factored form
of the reference's sum over dequantized operands (same products, another summation order).

The activation is quantized first (fp8_quantize_rows, one launch). Quantizing it inside the kernel for M <= 8 was
tried and removed: every program redoes its K range's quantization over the dot's padded 16 rows, and on the H200 an
M = 1 GEMV took 4x the time of the same shape at M = 32 (DeepSeek-V3 gate_up: 389 against 92 us).

Split-K reduction inside the one launch (the "last program reduces" fix-up): each split stores its float32 partial
into a workspace [splits, M, N] and bumps its column tile's counter (acquire-release); the split that finds every
other one done sums the partials in split order (deterministic), adds the bias, stores y in the model dtype and
resets the counter for the next call. The counters are one persistent zeroed int32 buffer per device that the kernel
leaves zeroed (CUDA-graph replays included). The atomics-into-a-zeroed-buffer version before it cost two more
launches a linear (the zeroing, the cast): on the H200, Qwen3-0.6B's fp8 decode step at batch 1 took 1.79 ms against
bf16's 0.83, most of it launches.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import pdl, pdl_prologue, pow2, prefetch, prefetch_l2
from atom_kernels.triton.attention.decode import num_sms
from atom_kernels.triton.fp8_quant import fp8_quantize_rows, use_fp8_dot

GEMV_MAX_M = 32  # M above: the tile GEMM (fp8_linear.py); 32 tokens fill the swapped MMA's N side
# K tiles a program asks L2 for before its PDL wait (_utils.prefetch_l2): the 4 its pipeline loads first; 264
# programs x 64 rows x 4 lines = 8.6 MB, what ~3 TB/s moves in the ~3 us of a norm or quantization kernel before it
PREFETCH_TILES = tl.constexpr(4)
MIN_BLOCKS_PER_SPLIT = 2  # K blocks per split at least: fewer makes the atomics' traffic comparable to the weight's


@triton.jit
def _block_product(w, q, FP8_DOT: tl.constexpr):
    """w [BLOCK_N, BLOCK_K] e4m3, q [BLOCK_M, BLOCK_K] e4m3 values → [BLOCK_N, BLOCK_M] fp32: sum over the block of
    w[n, k] * q[m, k] on tensor cores (e4m3 operands on sm_89+, else float16, exact for e4m3 values)."""
    if FP8_DOT:
        return tl.dot(w, tl.trans(q.to(w.dtype)), out_dtype=tl.float32)
    return tl.dot(w.to(tl.float16), tl.trans(q.to(tl.float16)), out_dtype=tl.float32)


@triton.jit
def _fp8_gemv_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, part_ptr, count_ptr, M, N, K, KB, KT,
                     BLOCKS_PER_SPLIT, SPLITS, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     ONE_SCALE: tl.constexpr, FP8_DOT: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
                     PREFETCH: tl.constexpr):
    # grid (cdiv(N, BLOCK_N), SPLITS): y[:M, n-tile] = xq[:M, :] @ w[n-tile, :]^T, split s summing K tiles
    # [s * BLOCKS_PER_SPLIT, +BLOCKS_PER_SPLIT) ∩ [0, KT). xq [M, K] e4m3 with xs [M, KB] fp32, w [N, K] e4m3,
    # ws [N, KB] fp32, y [M, N] model dtype; SPLITS > 1: part [SPLITS, M, N] fp32 workspace, count
    # [>= cdiv(N, BLOCK_N)] int32 zeroed. acc is y's tile transposed: [BLOCK_N, BLOCK_M]. K tile b has scale column
    # b (a scale block per tile), or 0 for every tile (ONE_SCALE: per channel / per token, KB = 1).
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(rn, N - 1).to(tl.int64)  # the last tile re-reads row N - 1 instead of masking; stores masked
    b0 = pid_k * BLOCKS_PER_SPLIT
    b1 = tl.minimum(b0 + BLOCKS_PER_SPLIT, KT)  # the split's K tiles: [b0, b1)
    if PREFETCH:  # the first PREFETCH_TILES K tiles of the split (one e4m3 line per row and tile at BLOCK_K 128)
        first = tl.minimum(b0 + tl.arange(0, PREFETCH_TILES), b1 - 1)
        prefetch_l2(w_ptr + rows[:, None] * K + first[None, :] * BLOCK_K)
    pdl_prologue(PDL)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for b in range(b0, b1):
        kk = b * BLOCK_K + rk
        # no eviction hint: it may keep Triton from pipelining the dot's operand loads (cp.async)
        w = tl.load(w_ptr + rows[:, None] * K + kk[None, :], mask=kk[None, :] < K, other=0.0)
        q = tl.load(xq_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        sb = 0 if ONE_SCALE else b
        xs = tl.load(xs_ptr + rm * KB + sb, mask=rm < M, other=0.0)
        ws = tl.load(ws_ptr + rows * KB + sb)
        acc += _block_product(w, q, FP8_DOT) * ws[:, None] * xs[None, :]
    tile = rm[None, :] * N + rn[:, None]
    mask = (rm[None, :] < M) & (rn[:, None] < N)
    if SPLITS > 1:
        tl.store(part_ptr + pid_k * M * N + tile, acc, mask=mask)
        # release: this split's partial is visible before its count; the last one to count acquires them all
        if tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel") == SPLITS - 1:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for s in range(0, SPLITS):  # split order: the same sum on every run
                acc += tl.load(part_ptr + s * M * N + tile, mask=mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + pid_n, 0)  # zeroed again for the next call
            _store_tile(y_ptr, b_ptr, acc, rows, tile, mask, HAS_BIAS)
    else:
        _store_tile(y_ptr, b_ptr, acc, rows, tile, mask, HAS_BIAS)


@triton.jit
def _store_tile(y_ptr, b_ptr, acc, rows, tile, mask, HAS_BIAS: tl.constexpr):
    """y's tile (acc [BLOCK_N, BLOCK_M] fp32, + the bias) rounded once to the model dtype, as the reference rounds."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows).to(tl.float32)[:, None]
    tl.store(y_ptr + tile, acc.to(y_ptr.dtype.element_ty), mask=mask)


COUNTERS = 1 << 16  # column tiles one call may have: N <= 4M at BLOCK_N 64


@functools.cache
def _counters(device: torch.device) -> torch.Tensor:
    """The split-K counters of a device: zeroed once, left zeroed by every launch (so a CUDA graph that captured a
    launch can replay it). Made by the first call, outside capture: the model's warm-up step runs every layer first."""
    return torch.zeros(COUNTERS, dtype=torch.int32, device=device)


def k_tiles(block_k: int, k: int) -> tuple[int, int, bool]:
    """How the GEMV and the tile GEMM walk K for scale blocks of block_k columns: (BLOCK_K, K tiles, ONE_SCALE). A
    block narrower than K is one tile (block_k a power of two, 16 to 256); one scale over all of K (per channel /
    per token: block_k >= k) is walked in tiles of 128 columns (fewer when K is smaller), all with scale column 0."""
    if block_k < k:
        return block_k, triton.cdiv(k, block_k), False
    tile = min(128, max(16, pow2(k)))
    return tile, triton.cdiv(k, tile), True


def gemv_config(m: int, n: int, kb: int, sms: int) -> dict:
    """Launch parameters for M = m rows (1 <= m <= GEMV_MAX_M) of an [n, kb K tiles] weight on `sms` SMs: BLOCK_N 64
    (one warpgroup's wgmma M), tokens padded to >= 16 (tl.dot's minimum); 4 stages of 8 KB weight tiles in flight
    per program (Triton pipelines a dot's operand loads)."""
    block_n = 64
    n_tiles = triton.cdiv(n, block_n)
    split = max(1, min(triton.cdiv(2 * sms, n_tiles), kb // MIN_BLOCKS_PER_SPLIT))  # ~2 programs per SM
    per = triton.cdiv(kb, split)
    return dict(BLOCK_M=max(16, pow2(m)), BLOCK_N=block_n, splits=triton.cdiv(kb, per), per=per, num_warps=4,
                num_stages=4)


def fp8_gemv(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_k: int,
             bias: torch.Tensor | None, **override) -> torch.Tensor:
    """x [M, K] (contiguous, 1 <= M <= GEMV_MAX_M), weight [N, K] e4m3 and weight_scale [N, KB] contiguous, bias [N]
    or None → y [M, N] in x's dtype: the activation quantized (fp8_quantize_rows), then gemv_quantized."""
    xq, xs = fp8_quantize_rows(x, block_k)
    return gemv_quantized(xq, xs, weight, weight_scale, block_k, bias, x.dtype, **override)


def gemv_quantized(xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_k: int,
                   bias: torch.Tensor | None, dtype: torch.dtype, **override) -> torch.Tensor:
    """The GEMV of a quantized activation: xq [M, K] e4m3 with xs [M, KB] float32 (row-major, fp8_quantize_rows'),
    → y [M, N] in dtype. `override` replaces gemv_config's entries (tests: splits/per)."""
    (m, k), n = xq.shape, weight.shape[0]
    block, tiles, one_scale = k_tiles(block_k, k)
    cfg = {**gemv_config(m, n, tiles, num_sms(xq.device)), **override}
    splits, per = cfg.pop("splits"), cfg.pop("per")
    y = torch.empty((m, n), dtype=dtype, device=xq.device)
    part = torch.empty((splits, m, n), dtype=torch.float32, device=xq.device) if splits > 1 else y
    counters = _counters(xq.device) if splits > 1 else y
    if triton.cdiv(n, cfg["BLOCK_N"]) > COUNTERS:
        raise ValueError(f"fp8_gemv: {n} output columns are more than its {COUNTERS} split-K counters cover")
    grid, launch = (triton.cdiv(n, cfg["BLOCK_N"]), splits), pdl(xq.device)
    _fp8_gemv_kernel[grid](xq, xs, weight, weight_scale, weight if bias is None else bias, y, part, counters, m, n, k,
                           weight_scale.shape[1], tiles, per, splits, BLOCK_K=block, ONE_SCALE=one_scale,
                           FP8_DOT=block >= 32 and use_fp8_dot(xq.device, dtype), HAS_BIAS=bias is not None, **cfg,
                           PREFETCH=prefetch(launch), **launch)
    return y
