"""MLA decode on Hopper (sm_90) for many heads: a warp-specialised warpgroup-MMA (wgmma) kernel in Gluon,
split-KV as mla_decode.

One program: BLOCK_H (64) heads of one token (128-head models run two programs a token), one split of its
sequence (as mla_decode: the split's range is derived in-kernel from the real seq_len), two warpgroups with
their own code (gl.warp_specialize), talking through mbarriers in shared memory:
  - the softmax warpgroup (a worker partition): per tile of BLOCK_N latent rows, the logits
    S = q_nope · c^T + q_pe · k_pe^T [64 heads, 64 rows] (wgmma, N = 64), the online softmax (log2 domain),
    P (16-bit) and the rescale factor alpha to shared memory, then the left half of the output,
    O[:, :256] = alpha * O[:, :256] + P · c[:, :256];
  - the load warpgroup (the default partition): gathers the paged latent rows with cp.async into a RING-tile
    ring (page ids one tile ahead), and computes the right half, O[:, 256:], from the same P and alpha.
So the right half's wgmma of tile j runs while the softmax warpgroup computes the logits of tile j + 1: the
tensor cores are not idle during the softmax. The logit dot is one N = 64 wgmma on one warpgroup instead of two
N = 32 halves, so each step reads less shared memory for the same flops. The ring holds two 64-row tiles
because the query takes 72 KB next to them. Timings, and the schedules that lost (lock-step warpgroups,
FlashMLA's seesaw, FA3-style 32-row tiles): docs/kernels/mla.md.

The partitions and their barriers: mla.hopper_partitions.

An fp8 (e4m3) cache: the ring holds e4m3 tiles (half the bytes); the load warpgroup upcasts each into one fp16
tile buffer (exact: fp16 holds e4m3; one conversion instruction per two values, bf16 would take more) when the
previous tile is done, which both warpgroups' wgmmas read, with the query pre-scaled into fp16 (mla_decode's
DOT_F16); the per-tensor scale goes on the logits and on the output, as in mla_decode. A slot's next tile is
issued as soon as the slot is upcast, so the e4m3 ring runs a tile ahead of the converted one. (There is no
room for two converted tiles next to the query: ~225 KB of shared memory either way.)

Scope (mla_decode_config picks this kernel only there): CUDA sm_90, 16-bit query, cache of the query's dtype or
e4m3, kv_lora_rank 512 and rope 64 (DeepSeek-V2/V3), more than 32 heads (up to 32: mla.hopper_few_heads). Everything
else, and any GPU without ~225 KB of shared memory a block, takes mla_decode's Triton kernel.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
)

from atom_kernels.triton._utils import FP8_DTYPES
from atom_kernels.triton.mla.hopper_partitions import (
    LOAD_THREADS,
    load_partition,
    row_layout,
    softmax_partition,
    thread_barrier,
)

BLOCK_H, BLOCK_N, WARPS = 64, 64, 4  # WARPS: one warpgroup a partition (8 warps in all)
RING = 2  # latent tiles the cp.async ring holds
SOFTMAX_REGS = 232  # the softmax warpgroup's registers a thread (left-half accumulator 128, logits 32, P)
# Gluon changes between triton releases: the kernels run on the versions they were tested with on a GPU, 3.6 (the GPU
# machine's own), 3.7 (vLLM 0.32's GPU build; it renamed thread_barrier barrier) and 3.8 (SGLang 0.5.23's: its Hopper
# decode tests passed on an H100, 2026-12-07); any other version takes the Triton kernel.
GLUON_TESTED = ("3.6.", "3.7.", "3.8.")
SUPPORTED = (triton.__version__.startswith(GLUON_TESTED) and thread_barrier is not None
             and hasattr(gl.NVMMASharedLayout, "get_default_for") and hasattr(gl, "warp_specialize")
             and hasattr(cp, "mbarrier_arrive"))
GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}


@gluon.jit
def gluon_pdl_prologue(PDL: gl.constexpr):
    """Gluon's form of _utils.pdl_prologue: wait for the kernels before this one, then let the next one launch."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def decode_rows(qsl_ptr, seq_lens_ptr, order_ptr, ordered, num_heads, num_splits, split, BLOCK_N: gl.constexpr):
    """This program's sequence (grid axis 2: the launch-order rank, as in mla_decode), its query row, the heads
    it loads and stores (none for a row that is not a decode: the prefill kernel has it; no early return around
    a warp-specialised region), and its split's rows [start, end) in n_tiles tiles."""
    seq = gl.program_id(2)
    if ordered != 0:
        seq = gl.load(order_ptr + seq)
    q_start = gl.load(qsl_ptr + seq).to(gl.int64)
    decode = gl.load(qsl_ptr + seq + 1) - q_start == 1
    live_heads = gl.where(decode, num_heads, 0)
    seq_len = gl.where(decode, gl.load(seq_lens_ptr + seq), 0)
    chunk = gl.cdiv(gl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = gl.minimum(start + chunk, seq_len)
    return seq, q_start, live_heads, start, end, gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)


@gluon.jit
def load_query(q_ptr, q_start, head0, live_heads, sq_t, sq_h, qk_scale, dtype: gl.constexpr, BLOCK_H: gl.constexpr,
               R: gl.constexpr, ROPE: gl.constexpr):
    """Heads [head0, head0 + BLOCK_H) of the query row (zero from live_heads on) in the dots' dtype, and the logits'
    scale: for fp16 dots on a bf16 query (fp8 caches) the query pre-scaled by qk_scale, as mla_decode's DOT_F16."""
    ld: gl.constexpr = row_layout(8)
    h = head0 + gl.arange(0, BLOCK_H, gl.SliceLayout(1, ld))
    c = gl.arange(0, R, gl.SliceLayout(0, ld))
    e = gl.arange(0, ROPE, gl.SliceLayout(0, ld))
    q_row = q_ptr + q_start * sq_t + h[:, None] * sq_h
    h_ok = (h < live_heads)[:, None]
    q = gl.load(q_row + c[None, :], mask=h_ok, other=0.0)
    q_pe = gl.load(q_row + (R + e)[None, :], mask=h_ok, other=0.0)
    qk = qk_scale
    if dtype != q_ptr.dtype.element_ty:
        q = (q.to(gl.float32) * qk_scale).to(dtype)
        q_pe = (q_pe.to(gl.float32) * qk_scale).to(dtype)
        qk = 1.0
    return q, q_pe, qk


@gluon.jit
def tile_buffers(q, q_pe, cache_ptr, q_sl: gl.constexpr, qpe_sl: gl.constexpr, kv_sl: gl.constexpr,
                 pe_sl: gl.constexpr, ring_sl: gl.constexpr, ring_pe_sl: gl.constexpr, RING: gl.constexpr,
                 BLOCK_N: gl.constexpr):
    """Shared memory: the query (in the dots' dtype), the ring of RING latent tiles (the cache's dtype), the
    tiles the dots read (for an fp8 cache one tile in the dots' dtype, the upcasts' target, else the ring), and the
    ring's barriers ready / free (mla.hopper_partitions' words; ready counts each load thread's cp.async arrival
    for 16-bit caches, one upcast arrival for fp8), initialised (the caller fences after its own)."""
    BLOCK_H: gl.constexpr = q.shape[0]
    R: gl.constexpr = q.shape[1]
    ROPE: gl.constexpr = q_pe.shape[1]
    CONVERT: gl.constexpr = cache_ptr.dtype.element_ty != q.dtype
    q_smem = gl.allocate_shared_memory(q.dtype, [BLOCK_H, R], q_sl, q)
    qpe_smem = gl.allocate_shared_memory(q.dtype, [BLOCK_H, ROPE], qpe_sl, q_pe)
    ring = gl.allocate_shared_memory(cache_ptr.dtype.element_ty, [RING, BLOCK_N, R], ring_sl)
    ring_pe = gl.allocate_shared_memory(cache_ptr.dtype.element_ty, [RING, BLOCK_N, ROPE], ring_pe_sl)
    if CONVERT:
        conv = gl.allocate_shared_memory(q.dtype, [1, BLOCK_N, R], kv_sl)
        conv_pe = gl.allocate_shared_memory(q.dtype, [1, BLOCK_N, ROPE], pe_sl)
    else:
        conv = ring
        conv_pe = ring_pe
    ready = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(RING):
        mbarrier.init(ready.index(b), count=1 if CONVERT else LOAD_THREADS)
        mbarrier.init(free.index(b), count=1)
    return q_smem, qpe_smem, ring, ring_pe, conv, conv_pe, ready, free


@gluon.jit
def output_rows(scale_ptr, qk, out_ptr, po_ptr, plse_ptr, seq, q_start, split, num_heads, num_splits, so_t, so_h,
                R: gl.constexpr, HAS_SCALE: gl.constexpr, SPLIT: gl.constexpr):
    """The logits' scale and the output's (times the cache scale), and where the output goes: (row base, head
    stride) of O, or of the split's partials [num_seqs, heads, num_splits, R], and of their lse
    [num_seqs, heads, num_splits]."""
    out_scale = 1.0
    if HAS_SCALE:
        out_scale = gl.load(scale_ptr).to(gl.float32)
        qk = qk * out_scale
    if SPLIT:
        out_row = (po_ptr + (seq * num_heads * num_splits + split).to(gl.int64) * R, num_splits * R)
        lse_row = (plse_ptr + (seq * num_heads).to(gl.int64) * num_splits + split, num_splits)
    else:
        out_row = (out_ptr + q_start * so_t, so_h)
        lse_row = (plse_ptr, 0)
    return qk, out_scale, out_row, lse_row


@gluon.jit(do_not_specialize=["num_splits", "ordered", "qsl_ptr", "seq_lens_ptr", "kv_indptr_ptr", "kv_indices_ptr",
                               "order_ptr"])
def _mla_decode_wgmma_kernel(
    q_ptr, cache_ptr, kv_indptr_ptr, kv_indices_ptr, seq_lens_ptr, qsl_ptr, order_ptr, scale_ptr, out_ptr, po_ptr,
    plse_ptr, qk_scale, num_splits, ordered, num_heads, sq_t, sq_h, so_t, so_h, s_b, s_t,
    q_sl: gl.constexpr, qpe_sl: gl.constexpr, kv_sl: gl.constexpr, pe_sl: gl.constexpr, p_sl: gl.constexpr,
    ring_sl: gl.constexpr, ring_pe_sl: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, RING: gl.constexpr, R: gl.constexpr,
    ROPE: gl.constexpr, HAS_SCALE: gl.constexpr, SPLIT: gl.constexpr, SOFTMAX_REGS: gl.constexpr, PDL: gl.constexpr,
):
    CONVERT: gl.constexpr = cache_ptr.dtype.element_ty != q_ptr.dtype.element_ty  # fp8 cache: tiles upcast
    # the dots' dtype: fp16 for fp8 caches (e4m3 -> fp16 is one conversion, -> bf16 more; fp16 holds e4m3 exactly),
    # the query then pre-scaled by qk_scale to stay in fp16's range, as mla_decode's DOT_F16
    dtype: gl.constexpr = gl.float16 if CONVERT else q_ptr.dtype.element_ty
    gluon_pdl_prologue(PDL)
    hg = gl.program_id(0)
    split = gl.program_id(1)
    seq, q_start, live_heads, start, end, n_tiles = decode_rows(qsl_ptr, seq_lens_ptr, order_ptr, ordered, num_heads,
                                                               num_splits, split, BLOCK_N)
    head0 = hg * BLOCK_H
    q, q_pe, qk = load_query(q_ptr, q_start, head0, live_heads, sq_t, sq_h, qk_scale, dtype, BLOCK_H, R, ROPE)
    q_smem, qpe_smem, ring, ring_pe, conv, conv_pe, ready, free = tile_buffers(
        q, q_pe, cache_ptr, q_sl, qpe_sl, kv_sl, pe_sl, ring_sl, ring_pe_sl, RING, BLOCK_N)
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_N], p_sl)
    a_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    p_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(p_full, count=1)
    mbarrier.init(p_free, count=1)
    fence_async_shared()

    qk, out_scale, out_row, lse_row = output_rows(scale_ptr, qk, out_ptr, po_ptr, plse_ptr, seq, q_start, split,
                                                  num_heads, num_splits, so_t, so_h, R, HAS_SCALE, SPLIT)
    pages = kv_indices_ptr + gl.load(kv_indptr_ptr + seq).to(gl.int64)
    # the load warpgroup is the default partition: triton 3.6 cannot build a reduction (the softmax's row max)
    # in the default partition, whose region has no warp count while it is built
    gl.warp_specialize([
        (load_partition, (cache_ptr, pages, ring, ring_pe, conv, conv_pe, p_smem, a_smem, ready, free, p_full,
                          p_free, n_tiles, start, end, s_b, s_t, out_row, live_heads, head0,
                          BLOCK_H, BLOCK_N, BLOCK_SIZE, R, ROPE, CONVERT)),
        (softmax_partition, (q_smem, qpe_smem, conv, conv_pe, p_smem, a_smem, ready, free, p_full, p_free, n_tiles,
                             start, end, qk, out_scale, out_row, lse_row, live_heads, head0,
                             BLOCK_H, BLOCK_N, R, SPLIT)),
    ], [4], [SOFTMAX_REGS])  # the softmax warpgroup: 4 warps (WARPS)


def shared_layouts(dtype: torch.dtype, cache_dtype: torch.dtype, r: int, rope: int, block_h: int, block_n: int,
                   p_shape: list) -> dict:
    """The NVMMA (wgmma-ready, swizzled) shared layouts of the kernels' buffers (16-bit ones: fp16 and bf16 share
    them, so the dots' dtype is the query's here): query, latent tiles (fp16 and the cache's dtype), P (p_shape)."""
    g, gc = GL_DTYPES[dtype], GL_DTYPES[cache_dtype]
    nvmma = gl.NVMMASharedLayout.get_default_for
    return dict(q_sl=nvmma([block_h, r], g), qpe_sl=nvmma([block_h, rope], g), kv_sl=nvmma([block_n, r], g),
                pe_sl=nvmma([block_n, rope], g), p_sl=nvmma(p_shape, g),
                ring_sl=nvmma([block_n, r], gc), ring_pe_sl=nvmma([block_n, rope], gc))


def wgmma_fits(query, cache, kv_lora_rank: int, out) -> bool:
    """The kernel's shapes: a 16-bit query, a cache of its dtype or fp8 (upcast exactly in shared memory), latent
    512 + rope 64, unit feature strides."""
    return (query.dtype in (torch.bfloat16, torch.float16) and cache.dtype in (query.dtype, *FP8_DTYPES)
            and kv_lora_rank == 512 and query.shape[2] - kv_lora_rank == 64
            and query.stride(2) == cache.stride(2) == out.stride(2) == 1)


def launch_mla_decode_wgmma(query, cache, kv_indptr, kv_indices, seq_lens, query_start_loc, qk_scale, kv_lora_rank,
                            cache_scale, out, po, plse, num_splits, ordered: tuple, launch: dict) -> None:
    """The decode kernel over one-token sequences; the caller merges splits (mla_decode.launch_mla_decode) and
    passes the launch order (order_ptr, flag) and its launch keywords (_utils.pdl, asked once a call)."""
    launch_gluon_decode(_mla_decode_wgmma_kernel, BLOCK_H, [BLOCK_H, BLOCK_N], RING, query, cache, kv_indptr,
                        kv_indices, seq_lens, query_start_loc, qk_scale, kv_lora_rank, cache_scale, out, po, plse,
                        num_splits, ordered, dict(launch, SOFTMAX_REGS=SOFTMAX_REGS, num_warps=WARPS))


def launch_gluon_decode(kernel, block_h: int, p_shape: list, ring: int, query, cache, kv_indptr, kv_indices,
                        seq_lens, query_start_loc, qk_scale, kv_lora_rank, cache_scale, out, po, plse, num_splits,
                        ordered: tuple, launch: dict) -> None:
    """Launch one of the Gluon decode kernels (their common arguments) with block_h heads a program, P's shared
    shape p_shape, a ring of `ring` tiles of BLOCK_N rows, and launch: the kernel's own keywords too."""
    _, heads, width = query.shape
    scaled = cache_scale is not None
    kernel[(-(-heads // block_h), num_splits, seq_lens.shape[0])](
        query, cache, kv_indptr, kv_indices, seq_lens, query_start_loc, ordered[0], cache_scale if scaled else query,
        out, po, plse, qk_scale, num_splits, ordered[1], heads, query.stride(0), query.stride(1), out.stride(0),
        out.stride(1), cache.stride(0), cache.stride(1),
        **shared_layouts(query.dtype, cache.dtype, kv_lora_rank, width - kv_lora_rank, block_h, BLOCK_N, p_shape),
        BLOCK_SIZE=cache.shape[1], BLOCK_H=block_h, BLOCK_N=BLOCK_N, RING=ring, R=kv_lora_rank,
        ROPE=width - kv_lora_rank, HAS_SCALE=scaled, SPLIT=num_splits > 1, **launch,
    )
