"""MLA decode on Hopper (sm_90) for few heads (16 or 32 a program): a warp-specialised wgmma kernel in Gluon
with the operands swapped, split-KV as mla_decode.

wgmma's M is at least 64, so with few heads the heads go on N and the latent rows on M:
  S^T [64 rows, H] = c · q_nope^T + k_pe · q_pe^T   (A: the latent tile, K-major; B: the query),
  O^T [512, H]     = alpha * O^T + c^T · P^T        (A: the same tile read transposed; B: P^T),
so no tensor-core work is spent on padding heads (mla.decode_hopper's kernel takes 64 heads a program). The online
softmax then runs down the columns of S^T (across the warpgroup's warps).

Two warpgroups (gl.warp_specialize), talking through mbarriers (as mla.decode_hopper; its barrier words):
  - the load warpgroup (the default partition): the cp.async ring of latent tiles (page ids one tile ahead; an
    fp8 ring of RING_FP8 36 KB tiles) and, for fp8 (e4m3) caches, the upcast of each tile into the one fp16 tile
    the dots read (exact; the query is pre-scaled into fp16, as mla_decode's DOT_F16), once the dots are done
    with the previous one;
  - the dot warpgroup (a worker): per tile, the logits, the online softmax (log2 domain), P^T to shared memory and
    the output; it stores O and the lse.
  ready[b]: tile b may be read (bf16/fp16: the cp.asyncs arrive themselves; fp8: the upcast is done);
  free[b]:  the dot warpgroup is done with tile b.
Why: at 16 heads the decode is memory-bound, and the Triton kernel (mma.sync, 16 heads a program) is bound by
its per-tile chain, not by the bytes, so an e4m3 cache was no faster than a bf16 one there. With an fp8 cache the
on-chip chain (upcast, then dots) is this kernel's time too: the loads are hidden behind it. Timings, where the
fp8 time goes, and the variants that lost: docs/kernels/mla.md.

Scope (mla_decode_config picks this kernel only there): CUDA sm_90, 16-bit query, cache of the query's dtype or
e4m3, kv_lora_rank 512 and rope 64, at most 32 heads.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from atom_kernels.triton.mla.decode_hopper import (
    decode_rows,
    gluon_pdl_prologue,
    launch_gluon_decode,
    load_query,
    output_rows,
    tile_buffers,
)
from atom_kernels.triton.mla.hopper_partitions import (
    issue_next,
    page_ids,
    ring_slot,
    row_layout,
    store_part,
    thread_barrier,
    upcast_tile,
)

BLOCK_N = 64  # latent rows a tile: wgmma's M
MAX_HEADS = 32  # heads a program (wgmma's N): 16 or 32
RING_FP8, RING_16 = 3, 2  # ring depth: e4m3 tiles (36 KB; plus the one 72 KB fp16 tile), 16-bit tiles (72 KB)
DOT_REGS = 240  # the dot warpgroup's registers a thread (O^T: 64 at 16 heads, 128 at 32; S^T 8 or 16)


@gluon.jit(do_not_specialize=["num_splits", "ordered", "qsl_ptr", "seq_lens_ptr", "kv_indptr_ptr", "kv_indices_ptr",
                               "order_ptr"])
def _mla_decode_few_heads_kernel(
    q_ptr, cache_ptr, kv_indptr_ptr, kv_indices_ptr, seq_lens_ptr, qsl_ptr, order_ptr, scale_ptr, out_ptr, po_ptr,
    plse_ptr, qk_scale, num_splits, ordered, num_heads, sq_t, sq_h, so_t, so_h, s_b, s_t,
    q_sl: gl.constexpr, qpe_sl: gl.constexpr, kv_sl: gl.constexpr, pe_sl: gl.constexpr, p_sl: gl.constexpr,
    ring_sl: gl.constexpr, ring_pe_sl: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, RING: gl.constexpr, R: gl.constexpr,
    ROPE: gl.constexpr, HAS_SCALE: gl.constexpr, SPLIT: gl.constexpr, DOT_REGS: gl.constexpr, PDL: gl.constexpr,
):
    CONVERT: gl.constexpr = cache_ptr.dtype.element_ty != q_ptr.dtype.element_ty  # fp8 cache: tiles upcast
    dtype: gl.constexpr = gl.float16 if CONVERT else q_ptr.dtype.element_ty  # the dots' (mla.decode_hopper's)
    gluon_pdl_prologue(PDL)
    hg = gl.program_id(0)
    split = gl.program_id(1)
    seq, q_start, live_heads, start, end, n_tiles = decode_rows(qsl_ptr, seq_lens_ptr, order_ptr, ordered, num_heads,
                                                               num_splits, split, BLOCK_N)
    head0 = hg * BLOCK_H
    q, q_pe, qk = load_query(q_ptr, q_start, head0, live_heads, sq_t, sq_h, qk_scale, dtype, BLOCK_H, R, ROPE)
    q_smem, qpe_smem, ring, ring_pe, conv, conv_pe, ready, free = tile_buffers(
        q, q_pe, cache_ptr, q_sl, qpe_sl, kv_sl, pe_sl, ring_sl, ring_pe_sl, RING, BLOCK_N)
    pt_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_H], p_sl)
    fence_async_shared()

    qk, out_scale, out_row, lse_row = output_rows(scale_ptr, qk, out_ptr, po_ptr, plse_ptr, seq, q_start, split,
                                                  num_heads, num_splits, so_t, so_h, R, HAS_SCALE, SPLIT)
    pages = kv_indices_ptr + gl.load(kv_indptr_ptr + seq).to(gl.int64)
    gl.warp_specialize([
        (_load_partition, (cache_ptr, pages, ring, ring_pe, conv, conv_pe, ready, free, n_tiles, start, end, s_b, s_t,
                           BLOCK_SIZE, R, ROPE, CONVERT)),
        (_dot_partition, (q_smem, qpe_smem, conv, conv_pe, pt_smem, ready, free, n_tiles, start, end, qk, out_scale,
                          out_row, lse_row, live_heads, head0, BLOCK_H, BLOCK_N, R, SPLIT)),
    ], [4], [DOT_REGS])


@gluon.jit
def _load_partition(cache_ptr, pages, ring, ring_pe, conv, conv_pe, ready, free, n_tiles, start, end, s_b, s_t,
                    BLOCK_SIZE: gl.constexpr, R: gl.constexpr, ROPE: gl.constexpr, CONVERT: gl.constexpr):
    """The ring's loads (a commit group a tile) and, for fp8 caches, the upcasts into the one fp16 tile."""
    VEC: gl.constexpr = 16 if CONVERT else 8
    BLOCK_N: gl.constexpr = ring.shape[1]
    RING: gl.constexpr = ring.shape[0]
    NOT_CONVERT: gl.constexpr = not CONVERT
    blk = page_ids(pages, 0, start, end, BLOCK_N, BLOCK_SIZE, VEC)
    for t in gl.static_range(RING):  # the ring's first tiles
        blk = issue_next(cache_ptr, pages, ring, ring_pe, ready, blk, t, n_tiles, start, end, s_b, s_t, NOT_CONVERT,
                         BLOCK_SIZE, R, ROPE, VEC)
    for j in range(n_tiles):
        b = j % RING
        if CONVERT:  # tile j into the fp16 tile once the dots are done with tile j - 1; then its ring slot is free
            mbarrier.wait(free.index(0), (j & 1) ^ 1)
            upcast_tile(ring, ring_pe, conv, conv_pe, b, ready, row_layout(VEC))
        else:  # the dots read the ring: slot b is free once they are done with tile j
            mbarrier.wait(free.index(b), (j // RING) & 1)
        blk = issue_next(cache_ptr, pages, ring, ring_pe, ready, blk, j + RING, n_tiles, start, end, s_b, s_t,
                         NOT_CONVERT, BLOCK_SIZE, R, ROPE, VEC)
    cp.wait_group(0)


@gluon.jit
def _dot_partition(q_smem, qpe_smem, conv, conv_pe, pt_smem, ready, free, n_tiles, start, end, qk, out_scale,
                   out_row, lse_row, num_heads, head0, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, R: gl.constexpr,
                   SPLIT: gl.constexpr):
    """Logits S^T, the online softmax down its columns, O^T += c^T P^T (module docstring); stores O and the lse."""
    NBUF: gl.constexpr = conv.shape[0]
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BLOCK_H, 16])  # S^T and O^T
    col: gl.constexpr = gl.SliceLayout(0, acc_l)  # per head
    m = gl.full([BLOCK_H], -1.0e30, gl.float32, col)
    den = gl.zeros([BLOCK_H], gl.float32, col)
    acc = gl.zeros([R, BLOCK_H], gl.float32, acc_l)
    ns = gl.arange(0, BLOCK_N, gl.SliceLayout(1, acc_l))
    for j in range(n_tiles):
        b, phase = ring_slot(j, NBUF)
        mbarrier.wait(ready.index(b), phase)
        fence_async_shared()  # cp.async (generic proxy) writes, read by the wgmma (async proxy)
        kv = conv.index(b)
        s = warpgroup_mma(kv, q_smem.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_H], gl.float32, acc_l), use_acc=False,
                          is_async=True)
        s = warpgroup_mma(conv_pe.index(b), qpe_smem.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        s = gl.where((start + j * BLOCK_N + ns < end)[:, None], s * qk, float("-inf"))
        m_new = gl.maximum(m, gl.max(s, 0))
        alpha = gl.exp2(m - m_new)
        p = gl.exp2(s - m_new[None, :])
        den = den * alpha + gl.sum(p, 0)
        m = m_new
        pt_smem.store(p.to(pt_smem.dtype))
        fence_async_shared()
        thread_barrier()
        acc = warpgroup_mma(kv.permute((1, 0)), pt_smem, acc * alpha[None, :])
        thread_barrier()  # every warp's part of the wgmma done before the tile is handed back
        mbarrier.arrive(free.index(b))
    inv = gl.where(den > 0, out_scale / gl.where(den > 0, den, 1.0), 0.0)
    # O (O^T transposed in registers: no data moves); the query's tile is dead now, only this warpgroup read it
    store_part(gl.permute(acc * inv[None, :], (1, 0)), q_smem, out_row, head0, 0, num_heads)
    if SPLIT:
        h = head0 + gl.arange(0, BLOCK_H, col)
        lse = gl.where(den > 0, m + gl.log2(den), float("-inf"))
        gl.store(lse_row[0] + h * lse_row[1], lse, mask=h < num_heads)


def launch_mla_decode_few_heads(query, cache, kv_indptr, kv_indices, seq_lens, query_start_loc, qk_scale,
                                kv_lora_rank, cache_scale, out, po, plse, num_splits, ordered: tuple,
                                launch: dict) -> None:
    """As mla.decode_hopper.launch_mla_decode_wgmma (same arguments and contract), for at most MAX_HEADS heads."""
    block_h = 16 if query.shape[1] <= 16 else MAX_HEADS
    ring = RING_FP8 if cache.dtype.itemsize == 1 else RING_16
    launch_gluon_decode(_mla_decode_few_heads_kernel, block_h, [BLOCK_N, block_h], ring, query, cache, kv_indptr,
                        kv_indices, seq_lens, query_start_loc, qk_scale, kv_lora_rank, cache_scale, out, po, plse,
                        num_splits, ordered, dict(launch, DOT_REGS=DOT_REGS, num_warps=4))
