"""moe_align: group a batch's (token, k) routing pairs by expert, in blocks of BLOCK_M rows, on the GPU.

Contract (pairs are numbered row-major over topk_ids [T, K]: pair i = t * K + k; N = T * K):
  sorted_ids [max_blocks * BLOCK_M] int32: expert 0's pairs, then expert 1's, ..., each expert's group in
      increasing pair order (stable) and padded with the sentinel N up to a multiple of BLOCK_M; empty
      experts take no rows. Entries at or past num_post_pad are left unwritten (nothing reads them).
  expert_ids [max_blocks] int32: the expert of each block of BLOCK_M rows (blocks past the end: unwritten).
  num_post_pad [1] int32: rows in use (sum over experts of their padded group size), on the device.
Pairs whose id lies outside [0, E) are dropped (checking would need a host sync): -1 is how expert parallelism
marks a pair whose expert is on another rank.

No host sync and every size comes from shapes, so it is CUDA-graph capturable: max_blocks bounds the
padded length, N + min(E, N) * (BLOCK_M - 1) (each non-empty expert pads by at most BLOCK_M - 1 rows).
Pair and chunk counts change step to step, so the kernels never specialize on them (a count of 1 or a
multiple of 16 would otherwise compile another variant mid-serving).
All deterministic (no atomics). Many pairs: three launches, per-chunk histograms; one program that turns
them into per-chunk offsets, expert starts, the block -> expert table and the padding sentinels; a scatter in
which each pair's row is its expert's start + the pairs of its expert in earlier chunks + those earlier in its
chunk. Few pairs (decode, up to SMALL_CHUNKS chunks): the same arithmetic in ONE program that walks the chunks
twice (histogram, then scatter with running per-expert counts), since at decode the launches, not the work,
cost the time (docs/kernels/moe.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import check, pdl, pdl_prologue, pow2

CHUNK = 128  # pairs per histogram / scatter program: the in-chunk rank is a [CHUNK, CHUNK] comparison
SMALL_CHUNKS = 4  # up to this many chunks (512 pairs: 64 tokens at top-8) one program aligns them all


@triton.jit
def _load_ids(ids_ptr, chunk, N, E, CHUNK: tl.constexpr):
    """Expert ids of one chunk of pairs, -1 past the end and for ids outside [0, E)."""
    i = chunk * CHUNK + tl.arange(0, CHUNK)
    e = tl.load(ids_ptr + i, mask=i < N, other=-1).to(tl.int32)
    return i, tl.where((e >= 0) & (e < E), e, -1)


@triton.jit(do_not_specialize=["N"])
def _count_kernel(ids_ptr, counts_ptr, N, E, CHUNK: tl.constexpr, E_PAD: tl.constexpr, PDL: tl.constexpr):
    # grid (num_chunks,): counts[c, e] = pairs of chunk c routed to expert e; counts is [num_chunks, E_PAD].
    pdl_prologue(PDL)
    c = tl.program_id(0)
    _, e = _load_ids(ids_ptr, c, N, E, CHUNK)
    ex = tl.arange(0, E_PAD)
    tl.store(counts_ptr + c * E_PAD + ex, tl.sum(_hits(e, E_PAD), axis=0))


@triton.jit
def _hits(e, E_PAD: tl.constexpr):
    """[CHUNK, E_PAD] int32 one-hot of each pair's expert (all zero for dropped pairs)."""
    return (e[:, None] == tl.arange(0, E_PAD)[None, :]).to(tl.int32)


@triton.jit
def _rank_in_chunk(e, CHUNK: tl.constexpr):
    """[CHUNK]: pairs of the same expert earlier in the chunk."""
    r = tl.arange(0, CHUNK)
    return tl.sum(((e[:, None] == e[None, :]) & (r[None, :] < r[:, None])).to(tl.int32), axis=1)


@triton.jit(do_not_specialize=["num_chunks", "sentinel"])
def _offsets_kernel(counts_ptr, starts_ptr, sorted_ptr, expert_ids_ptr, post_pad_ptr, num_chunks, E, sentinel,
                    BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, C_TILE: tl.constexpr, B_TILE: tl.constexpr,
                    PDL: tl.constexpr):
    # One program. counts [num_chunks, E_PAD] becomes, in place, each chunk's offset inside its expert's group
    # (exclusive prefix sum over chunks); starts[e] = first row of expert e's group.
    pdl_prologue(PDL)
    ex = tl.arange(0, E_PAD)
    total = tl.zeros([E_PAD], tl.int32)
    for c0 in range(0, num_chunks, C_TILE):
        c = c0 + tl.arange(0, C_TILE)
        ptrs = counts_ptr + c[:, None] * E_PAD + ex[None, :]
        cmask = (c < num_chunks)[:, None]
        cnt = tl.load(ptrs, mask=cmask, other=0)
        tl.store(ptrs, tl.cumsum(cnt, axis=0) - cnt + total[None, :], mask=cmask)
        total += tl.sum(cnt, axis=0)
    start = _layout(total, sorted_ptr, expert_ids_ptr, post_pad_ptr, sentinel, BLOCK_M, E_PAD, B_TILE)
    tl.store(starts_ptr + ex, start)


@triton.jit
def _layout(total, sorted_ptr, expert_ids_ptr, post_pad_ptr, sentinel,
            BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, B_TILE: tl.constexpr):
    """From the pairs per expert [E_PAD]: writes the rows in use, the padding sentinels and the block -> expert
    table; returns each expert's first row [E_PAD]."""
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    start = end - padded
    rows_in_use = tl.sum(padded, axis=0)
    tl.store(post_pad_ptr, rows_in_use)
    # the < BLOCK_M sentinel rows that end each group, [E_PAD, 16] at a time (a whole [E_PAD, 128] tile spills)
    for m0 in tl.static_range(0, BLOCK_M, 16):
        pad_rows = (start + total + m0)[:, None] + tl.arange(0, 16)[None, :]
        tl.store(sorted_ptr + pad_rows, sentinel + tl.zeros_like(pad_rows), mask=pad_rows < end[:, None])
    # block b belongs to the first expert whose group ends after row b * BLOCK_M (empty groups end where they start)
    for b0 in range(0, rows_in_use // BLOCK_M, B_TILE):
        b = b0 + tl.arange(0, B_TILE)
        expert = tl.sum((end[None, :] <= b[:, None] * BLOCK_M).to(tl.int32), axis=1)
        tl.store(expert_ids_ptr + b, expert, mask=b * BLOCK_M < rows_in_use)
    return start


@triton.jit(do_not_specialize=["N"])
def _scatter_kernel(ids_ptr, offsets_ptr, starts_ptr, sorted_ptr, N, E, CHUNK: tl.constexpr, E_PAD: tl.constexpr,
                    PDL: tl.constexpr):
    # grid (num_chunks,): pair i goes to row starts[e] + offsets[c, e] + (earlier pairs of chunk c with expert e).
    pdl_prologue(PDL)
    c = tl.program_id(0)
    i, e = _load_ids(ids_ptr, c, N, E, CHUNK)
    ok = e >= 0
    base = tl.load(starts_ptr + e, mask=ok, other=0) + tl.load(offsets_ptr + c * E_PAD + e, mask=ok, other=0)
    tl.store(sorted_ptr + base + _rank_in_chunk(e, CHUNK), i.to(tl.int32), mask=ok)


@triton.jit(do_not_specialize=["N", "num_chunks"])
def _align_one_program(ids_ptr, sorted_ptr, expert_ids_ptr, post_pad_ptr, N, E, num_chunks,
                       BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, E_PAD: tl.constexpr, B_TILE: tl.constexpr,
                       PDL: tl.constexpr):
    # grid (1,): the three kernels above in one program, for a few chunks (the histogram pass re-reads the ids).
    pdl_prologue(PDL)
    total = tl.zeros([E_PAD], tl.int32)
    for c in range(num_chunks):
        _, e = _load_ids(ids_ptr, c, N, E, CHUNK)
        total += tl.sum(_hits(e, E_PAD), axis=0)
    # next free row of each expert's group; a pair's base row is picked from it through its one-hot row
    free = _layout(total, sorted_ptr, expert_ids_ptr, post_pad_ptr, N, BLOCK_M, E_PAD, B_TILE)
    for c in range(num_chunks):
        i, e = _load_ids(ids_ptr, c, N, E, CHUNK)
        hits = _hits(e, E_PAD)
        base = tl.sum(hits * free[None, :], axis=1)
        tl.store(sorted_ptr + base + _rank_in_chunk(e, CHUNK), i.to(tl.int32), mask=e >= 0)
        free += tl.sum(hits, axis=0)


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound on the blocks moe_align fills, from shapes only."""
    return triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """topk_ids [T, K] int (contiguous) → (sorted_ids, expert_ids, num_post_pad), see the module docstring."""
    check(topk_ids.dim() == 2 and not topk_ids.is_floating_point() and topk_ids.is_contiguous(),
          f"moe_align: topk_ids must be a contiguous int [tokens, top_k] tensor, got {tuple(topk_ids.shape)} "
          f"{topk_ids.dtype} (call .contiguous())")
    check(num_experts >= 1 and block_m >= 16 and block_m & (block_m - 1) == 0,
          f"moe_align: need num_experts >= 1 and a power-of-two block_m >= 16, got {num_experts}, {block_m}")
    n = topk_ids.numel()
    dev = topk_ids.device
    blocks = max_blocks(n, num_experts, block_m)
    sorted_ids = torch.empty(blocks * block_m, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(blocks, dtype=torch.int32, device=dev)
    if n == 0:
        return sorted_ids, expert_ids, torch.zeros(1, dtype=torch.int32, device=dev)
    num_post_pad = torch.empty(1, dtype=torch.int32, device=dev)  # (written by the kernels: no memset launch)
    e_pad = pow2(num_experts, 16)
    launch = pdl(dev)
    chunks = triton.cdiv(n, CHUNK)
    if chunks <= SMALL_CHUNKS:
        chunk = min(CHUNK, pow2(n, 16))  # fewer pairs than a chunk: a smaller one-hot and rank tile
        _align_one_program[(1,)](topk_ids, sorted_ids, expert_ids, num_post_pad, n, num_experts,
                                 triton.cdiv(n, chunk), BLOCK_M=block_m, CHUNK=chunk, E_PAD=e_pad,
                                 B_TILE=max(16, 4096 // e_pad), num_warps=8, **launch)
        return sorted_ids, expert_ids, num_post_pad
    offsets = torch.empty((chunks, e_pad), dtype=torch.int32, device=dev)
    starts = torch.empty(e_pad, dtype=torch.int32, device=dev)
    _count_kernel[(chunks,)](topk_ids, offsets, n, num_experts, CHUNK=CHUNK, E_PAD=e_pad, **launch)
    _offsets_kernel[(1,)](offsets, starts, sorted_ids, expert_ids, num_post_pad, chunks, num_experts, n,
                          BLOCK_M=block_m, E_PAD=e_pad, C_TILE=max(1, 4096 // e_pad),
                          B_TILE=max(16, 4096 // e_pad), **launch)
    _scatter_kernel[(chunks,)](topk_ids, offsets, starts, sorted_ids, n, num_experts, CHUNK=CHUNK, E_PAD=e_pad,
                               **launch)
    return sorted_ids, expert_ids, num_post_pad
