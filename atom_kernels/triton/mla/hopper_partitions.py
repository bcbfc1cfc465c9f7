"""The two warpgroups of mla.decode_hopper's warp-specialised MLA decode kernel (see its docstring), and the
mbarrier protocol between them.

Barriers (phases count tiles; each is waited on by one warpgroup and arrived on by the other):
  ready[b]  tile in ring slot b may be read: bf16/fp16 caches, by the cp.asyncs themselves (every load thread's
            cp.async.mbarrier.arrive.noinc: count = load threads); fp8 caches, by the load warpgroup once it has
            upcast the tile into the one converted buffer (count 1);
  free[b]   the softmax warpgroup is done with the tile in slot b (its logit and left-half wgmmas);
  p_full    P and alpha of the tile are in shared memory (after the last tile: the final 1 / den);
  p_free    the load warpgroup has read them (its right-half wgmma is done).
The load warpgroup waits free before it arrives p_free, so the softmax warpgroup is never two phases ahead on
any barrier.
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

# The CTA-wide barrier: gl.thread_barrier up to triton 3.6, gl.barrier from 3.7 (vLLM 0.32's GPU build).
thread_barrier = getattr(gl, "thread_barrier", None) or getattr(gl, "barrier", None)
# cp.async of a pointer tile into shared memory: async_copy_global_to_shared up to 3.7, async_load from 3.8 (3.9 removed
# the old name)
async_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared
LOAD_THREADS = gl.constexpr(4 * 32)  # the load warpgroup's threads: one cp.async arrival each on ready


@gluon.constexpr_function
def row_layout(vec):
    """16-byte chunks (vec elements), 4 warps down the rows, 64 columns a warp row. For 8-bit elements (vec 16:
    the e4m3 ring's cp.asyncs and upcasts) the threads run down the rows first, so the 8 threads of a 16-byte
    shared access phase take one chunk of 8 rows: the 128-byte swizzle (chunk ^ row % 8) puts those in 8 different
    bank groups, for the e4m3 reads and the fp16 writes alike. Along the rows (two rows a phase, 4 chunks each) the
    e4m3 reads were 2-way bank conflicts (ncu; measurements: docs/kernels/mla.md)."""
    order = [0, 1] if vec == 16 else [1, 0]
    return gl.BlockedLayout([1, vec], [32 * vec // 64, 64 // vec], [4, 1], order)


@gluon.jit
def ring_slot(j, NBUF: gl.constexpr):
    """(buffer index, mbarrier phase) of tile j in an NBUF-deep ring."""
    return j % NBUF, (j // NBUF) & 1


@gluon.jit
def page_ids(pages, t, start, end, BLOCK_N: gl.constexpr, BLOCK_SIZE: gl.constexpr, VEC: gl.constexpr):
    """Page ids [BLOCK_N] of tile t's rows (0 past end)."""
    n = start + t * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(1, row_layout(VEC)))
    return gl.load(pages + n // BLOCK_SIZE, mask=n < end, other=0).to(gl.int64)


@gluon.jit
def issue_tile(cache_ptr, ring, ring_pe, slot, blk, t, start, end, s_b, s_t, ready, ASYNC_ARRIVE: gl.constexpr,
                BLOCK_SIZE: gl.constexpr, R: gl.constexpr, ROPE: gl.constexpr, VEC: gl.constexpr):
    """cp.async tile t's latent rows (pages blk) into ring slot `slot` (rows past end zero-filled); one commit
    group. ASYNC_ARRIVE: each thread's copies arrive on ready[slot] when they land."""
    ld: gl.constexpr = row_layout(VEC)
    BLOCK_N: gl.constexpr = ring.shape[1]
    n = start + t * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(1, ld))
    row = cache_ptr + blk * s_b + (n % BLOCK_SIZE).to(gl.int64) * s_t
    valid = (n < end)[:, None]
    c = gl.arange(0, R, gl.SliceLayout(0, ld))
    e = gl.arange(0, ROPE, gl.SliceLayout(0, ld))
    async_load(ring.index(slot), row[:, None] + c[None, :], mask=valid)
    async_load(ring_pe.index(slot), row[:, None] + (R + e)[None, :], mask=valid)
    if ASYNC_ARRIVE:
        cp.mbarrier_arrive(ready.index(slot), increment_count=False)
    cp.commit_group()


@gluon.jit
def issue_next(cache_ptr, pages, ring, ring_pe, ready, blk, t, n_tiles, start, end, s_b, s_t,
               ASYNC_ARRIVE: gl.constexpr, BLOCK_SIZE: gl.constexpr, R: gl.constexpr, ROPE: gl.constexpr,
               VEC: gl.constexpr):
    """issue_tile for tile t (pages blk) into ring slot t % RING, or an empty commit group past the last tile (so
    that group counts stay per tile); returns the page ids of tile t + 1 (page ids one tile ahead)."""
    if t < n_tiles:
        issue_tile(cache_ptr, ring, ring_pe, t % ring.shape[0], blk, t, start, end, s_b, s_t, ready, ASYNC_ARRIVE,
                   BLOCK_SIZE, R, ROPE, VEC)
    else:
        cp.commit_group()
    return page_ids(pages, t + 1, start, end, ring.shape[1], BLOCK_SIZE, VEC)


@gluon.jit
def softmax_partition(q_smem, qpe_smem, conv, conv_pe, p_smem, a_smem, ready, free, p_full, p_free, n_tiles, start,
                      end, qk, out_scale, out_row, lse_row, num_heads, head0,
                      BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, R: gl.constexpr, SPLIT: gl.constexpr):
    """Logits, online softmax and the left half of the output (module docstring); writes O[:, :R/2] and the lse.
    conv: the tiles the wgmmas read (the ring itself, or for fp8 caches the one converted tile)."""
    HALF: gl.constexpr = R // 2
    NBUF: gl.constexpr = conv.shape[0]
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    m = gl.full([BLOCK_H], -1.0e30, gl.float32, gl.SliceLayout(1, s_l))
    den = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_l))
    acc = gl.zeros([BLOCK_H, HALF], gl.float32, o_l)
    ns = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_l))
    for j in range(n_tiles):
        b, phase = ring_slot(j, NBUF)
        mbarrier.wait(ready.index(b), phase)
        fence_async_shared()  # cp.async (generic proxy) writes, read by the wgmma (async proxy)
        kv = conv.index(b)
        pe = conv_pe.index(b)
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
        mbarrier.wait(p_free, (j & 1) ^ 1)  # the load warpgroup is done with tile j - 1's P (j = 0: passes)
        p_smem.store(p.to(p_smem.dtype))
        a_smem.store(alpha)
        fence_async_shared()
        thread_barrier()
        mbarrier.arrive(p_full)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        acc = warpgroup_mma(p_smem, kv.slice(0, HALF, dim=1), acc)
        thread_barrier()  # every warp's part of the wgmma done before the slot is handed back
        mbarrier.arrive(free.index(b))
    # the final scale for both halves: 1 / den (0 where no key), times the cache scale
    inv = gl.where(den > 0, out_scale / gl.where(den > 0, den, 1.0), 0.0)
    mbarrier.wait(p_free, (n_tiles & 1) ^ 1)
    a_smem.store(inv)
    thread_barrier()
    mbarrier.arrive(p_full)
    o = acc * gl.convert_layout(inv, gl.SliceLayout(1, o_l))[:, None]
    store_part(o, q_smem, out_row, head0, 0, num_heads)  # the query's tile: read only by this warpgroup's dots
    if SPLIT:
        hs = head0 + gl.arange(0, BLOCK_H, gl.SliceLayout(1, s_l))
        lse = gl.where(den > 0, m + gl.log2(den), float("-inf"))
        gl.store(lse_row[0] + hs * lse_row[1], lse, mask=hs < num_heads)


@gluon.constexpr_function
def staging_layout(shape, dtype):
    """The shared layout a 16-bit output part is staged in (wgmma's swizzled one: few bank conflicts either way)."""
    return gl.NVMMASharedLayout.get_default_for(shape, dtype)


# A shared buffer viewed as another dtype / shape / layout: _reinterpret up to 3.8, reinterpret from 3.9
if hasattr(gl.shared_memory_descriptor, "reinterpret"):
    @gluon.jit
    def view_as(buf, dt: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return buf.reinterpret(dt, shape, layout)
else:
    @gluon.jit
    def view_as(buf, dt: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return buf._reinterpret(dt, shape, layout)


@gluon.jit
def store_part(o, buf, out_row, head0, c0, num_heads):
    """o [BLOCK_H, W] (fp32: a wgmma accumulator, or one transposed in registers) to out_row[0] + head * out_row[1]
    + c0 + column: the output's row of the token, or the split's partials. A warp's store in the accumulator layout
    covers 8 bytes of 4 threads in each of 8 rows: whole 32-byte sectors for fp32 partials, half sectors for a 16-bit
    output. Those half-sector writes showed at the kernel's end, so a 16-bit output is staged through buf, a shared
    tile this warpgroup alone uses now (>= the part's bytes), and read back in 16-byte row chunks (whole 128-byte
    lines a warp). fp32 partials are stored directly: staging them cost time (docs/kernels/mla.md)."""
    BLOCK_H: gl.constexpr = o.shape[0]
    W: gl.constexpr = o.shape[1]
    dt: gl.constexpr = out_row[0].dtype.element_ty
    if dt.primitive_bitwidth == 32:
        ld: gl.constexpr = o.type.layout
        x = o
    else:
        # buf whole as [ROWS, W] of dt, then its first BLOCK_H rows: a reinterpretation keeps the bytes (triton 3.8
        # refuses a smaller one), and any BLOCK_H rows of buf serve, as store and load use the same view
        ROWS: gl.constexpr = buf.shape[0] * buf.shape[1] * buf.dtype.primitive_bitwidth // (W * dt.primitive_bitwidth)
        stage = view_as(buf, dt, [ROWS, W], staging_layout([ROWS, W], dt)).slice(0, BLOCK_H, dim=0)
        stage.store(o.to(dt))
        thread_barrier()
        ld: gl.constexpr = row_layout(8)
        x = stage.load(ld)
    h = head0 + gl.arange(0, BLOCK_H, gl.SliceLayout(1, ld))
    c = c0 + gl.arange(0, W, gl.SliceLayout(0, ld))
    gl.store(out_row[0] + h[:, None].to(gl.int64) * out_row[1] + c[None, :], x.to(dt), mask=(h < num_heads)[:, None])


@gluon.jit
def load_partition(cache_ptr, pages, ring, ring_pe, conv, conv_pe, p_smem, a_smem, ready, free, p_full, p_free,
                   n_tiles, start, end, s_b, s_t, out_row, num_heads, head0,
                   BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_SIZE: gl.constexpr, R: gl.constexpr,
                   ROPE: gl.constexpr, CONVERT: gl.constexpr):
    """The latent ring's loads (and fp8 upcasts) and the right half of the output; writes O[:, R/2:]."""
    HALF: gl.constexpr = R // 2
    VEC: gl.constexpr = 16 if CONVERT else 8
    ld: gl.constexpr = row_layout(VEC)
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    NOT_CONVERT: gl.constexpr = not CONVERT
    blk = page_ids(pages, 0, start, end, BLOCK_N, BLOCK_SIZE, VEC)
    RING: gl.constexpr = ring.shape[0]
    for t in gl.static_range(RING):  # the ring's first tiles
        blk = issue_next(cache_ptr, pages, ring, ring_pe, ready, blk, t, n_tiles, start, end, s_b, s_t, NOT_CONVERT,
                         BLOCK_SIZE, R, ROPE, VEC)
    # the tile a free ring slot takes next: for 16-bit caches the slot of tile j (done) takes tile j + RING; for fp8
    # caches that of tile j + 1, free once upcast, takes tile j + 1 + RING (faster than refilling the slot a tile
    # later, as 16-bit caches must: docs/kernels/mla.md)
    AHEAD: gl.constexpr = RING + 1 if CONVERT else RING
    if CONVERT:
        if n_tiles > 0:
            upcast_tile(ring, ring_pe, conv, conv_pe, 0, ready, ld)
            blk = issue_next(cache_ptr, pages, ring, ring_pe, ready, blk, RING, n_tiles, start, end, s_b, s_t,
                             NOT_CONVERT, BLOCK_SIZE, R, ROPE, VEC)
    acc = gl.zeros([BLOCK_H, HALF], gl.float32, o_l)
    for j in range(n_tiles):
        mbarrier.wait(p_full, j & 1)
        fence_async_shared()
        b, phase = ring_slot(j, conv.shape[0])  # conv: the ring itself, or for fp8 caches the one converted tile
        acc = acc * a_smem.load(gl.SliceLayout(1, o_l))[:, None]
        acc = warpgroup_mma(p_smem, conv.index(b).slice(HALF, HALF, dim=1), acc)
        mbarrier.wait(free.index(b), phase)  # the softmax warpgroup is done with tile j too
        thread_barrier()
        mbarrier.arrive(p_free)
        if CONVERT:
            if j + 1 < n_tiles:
                upcast_tile(ring, ring_pe, conv, conv_pe, (j + 1) % RING, ready, ld)
        blk = issue_next(cache_ptr, pages, ring, ring_pe, ready, blk, j + AHEAD, n_tiles, start, end, s_b, s_t,
                         NOT_CONVERT, BLOCK_SIZE, R, ROPE, VEC)
    mbarrier.wait(p_full, n_tiles & 1)  # the final scale
    o = acc * a_smem.load(gl.SliceLayout(1, o_l))[:, None]
    cp.wait_group(0)  # (only empty groups are left)
    # both warpgroups' wgmmas are done with every tile (the softmax warpgroup arrived the final p_full after them)
    store_part(o, conv.index(0), out_row, head0, HALF, num_heads)


@gluon.jit
def upcast_tile(ring, ring_pe, conv, conv_pe, slot, ready, ld: gl.constexpr):
    """fp8 caches: the e4m3 tile in ring slot `slot` (the oldest of two commit groups in flight) into the converted
    buffer; each thread upcasts what it copied (its own cp.asyncs: no barrier before), then ready[0]."""
    cp.wait_group(ring.shape[0] - 1)
    conv.index(0).store(ring.index(slot).load(ld).to(conv.dtype))
    conv_pe.index(0).store(ring_pe.index(slot).load(ld).to(conv.dtype))
    fence_async_shared()
    thread_barrier()
    mbarrier.arrive(ready.index(0))
