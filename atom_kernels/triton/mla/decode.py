"""MLA decode (one new token per sequence) over a paged latent cache: split-KV flash-decoding.

Grid (head_groups, num_splits, num_seqs). One program holds BLOCK_H query heads of one token as a
[BLOCK_H, R + ROPE] tile and walks one contiguous split of the sequence's latent rows: each row it loads
serves all BLOCK_H heads (as key for both logit dots and as value), so with BLOCK_H >= heads (the default up
to 64 heads) every latent row is read once per split. With more heads than BLOCK_H (128 heads) the head groups
of one (split, sequence) are neighbours on the grid's fastest axis: they run together and the second read of
a row comes from L2, not HBM. A second kernel (attention_decode's merge) combines the splits by log-sum-exp.

Pages come from the MLA decode metadata (kv_indptr, kv_indices: page ids, see reference.mla.mla_kv_indices):
page j of sequence i is kv_indices[kv_indptr[i] + j]. The split count only tunes parallelism: each split's
range is derived in-kernel from the real seq_len, so a grid sized from a max_seq_len hint that is only an upper
bound (CUDA graphs) still covers every row. No host sync anywhere.

Launch order: sequences are the grid's slowest axis, so all programs of one sequence start together; with
`order` (attention_decode.decode_order: longest first, made once a step, only where the grid is more than one
wave of resident programs) the longest start first and the short ones fill the last wave. Any permutation gives
the same result.

fp8 (e4m3) caches: dequantised by the per-tensor scale on the logits and on the output, never per element.
With bf16 queries the dots then run in fp16 (e4m3 -> fp16 is one conversion, -> bf16 two; fp16 holds e4m3
exactly), the query pre-scaled by softmax_scale * log2(e) to stay in fp16's range (as attention_decode).

Two launch options, meant for fp8 caches (both exact; mla_decode_config turns them on where the sweep,
benchmarks/mla_decode.py --sweep, found them faster: docs/kernels/mla.md):
  PREFETCH: the next latent tile is loaded into registers at the top of each iteration, before the dots on the
    current one (its page ids one tile earlier still), so its global loads are in flight during the dots. At
    16 heads per program (mma.sync dots) Triton's pipeliner leaves the e4m3 tile a plain load inside the
    iteration, converted twice (once per dot layout), so pipeline stages do not help it. Prefetched, it is
    converted once and stored to shared memory as fp16 for both dots. The price is the registers of a tile in
    flight (ptxas, sm_90: at 4 warps 32-row tiles spill, 8 warps do not; at 64 heads per program, where the
    pipeliner does copy the e4m3 tile ahead, it adds to the fp8 path's spills).
  F8_BITS: e4m3 -> fp16 by integer ops that yield value / 256 (mla_common.e4m3_bits_as_f16) instead of the
    F2FP conversion; the 2^8 goes back on the logits' scale and on the output.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import check, pdl, pdl_prologue, pow2
from atom_kernels.triton.attention.common import load_block_ids
from atom_kernels.triton.attention.decode import _merge_kernel, check_grid_seqs, num_sms, order_args, pick_splits
from atom_kernels.triton.mla.common import attend_latent, load_latent_tile, load_query

try:
    from atom_kernels.triton.mla.decode_hopper import SUPPORTED as GLUON_HOPPER
    from atom_kernels.triton.mla.decode_hopper import launch_mla_decode_wgmma, wgmma_fits
    from atom_kernels.triton.mla.hopper_few_heads import MAX_HEADS as FEW_HEADS
    from atom_kernels.triton.mla.hopper_few_heads import launch_mla_decode_few_heads
except (ImportError, AttributeError):  # a triton without Gluon (or another Gluon API): the Triton kernel
    GLUON_HOPPER = False

    def wgmma_fits(query, cache, kv_lora_rank, out) -> bool:
        return False


# Step-varying counts and step-buffer pointers are not specialized (no recompiles mid-serving), as in _decode_kernel.
@triton.jit(do_not_specialize=["num_splits", "ordered", "qsl_ptr", "seq_lens_ptr", "kv_indptr_ptr", "kv_indices_ptr",
                               "order_ptr"])
def _mla_decode_kernel(
    q_ptr, cache_ptr, kv_indptr_ptr, kv_indices_ptr, seq_lens_ptr, qsl_ptr, order_ptr, scale_ptr, out_ptr, po_ptr,
    plse_ptr, qk_scale, num_splits, ordered, num_heads, R, ROPE,
    sq_t, sq_h, sq_d, so_t, so_h, so_d, s_b, s_t, s_d,
    BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, R_PAD: tl.constexpr,
    PE_PAD: tl.constexpr, HAS_SCALE: tl.constexpr, SPLIT: tl.constexpr, DOT_F16: tl.constexpr,
    PREFETCH: tl.constexpr, F8_BITS: tl.constexpr, PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    hg = tl.program_id(0)
    split = tl.program_id(1)
    seq = tl.program_id(2)  # the launch-order rank (attention_decode.decode_order): a sequence when not ordered
    if ordered != 0:
        seq = tl.load(order_ptr + seq)
    q_start = tl.load(qsl_ptr + seq).to(tl.int64)
    if tl.load(qsl_ptr + seq + 1) - q_start != 1:  # not a decode: the prefill kernel has it
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    heads = hg * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < num_heads
    rows = q_start + heads * 0
    q, q_pe = load_query(q_ptr, rows, heads, h_mask, sq_t, sq_h, sq_d, R, ROPE, R_PAD, PE_PAD)
    qk = qk_scale
    if DOT_F16:  # fp8 cache, bf16 query: fp16 dots (module docstring), the query pre-scaled
        q = (q.to(tl.float32) * qk_scale).to(tl.float16)
        q_pe = (q_pe.to(tl.float32) * qk_scale).to(tl.float16)
        qk = 1.0
    if HAS_SCALE:
        qk = qk * tl.load(scale_ptr).to(tl.float32)
    if F8_BITS:  # the tiles come as e4m3 / 256
        qk = qk * 256.0
    m = tl.full([BLOCK_H], -1.0e30, tl.float32)
    den = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, R_PAD], tl.float32)
    pages = kv_indices_ptr + tl.load(kv_indptr_ptr + seq).to(tl.int64)
    n = start + tl.arange(0, BLOCK_N)
    blk = load_block_ids(pages, 1, n, n < end, BLOCK_SIZE)
    if PREFETCH:  # latent tile i + 1 in flight in registers while tile i is used; page ids of i + 2 meanwhile
        kv, pe = load_latent_tile(cache_ptr, blk, n, n < end, s_b, s_t, s_d, R, ROPE, BLOCK_SIZE, R_PAD, PE_PAD)
        blk = load_block_ids(pages, 1, n + BLOCK_N, n + BLOCK_N < end, BLOCK_SIZE)
        for n0 in range(start, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n1 = n + BLOCK_N
            # blk: tile i + 1's pages, loaded one iteration ago, so tile i + 1's loads wait for nothing
            blk_next = load_block_ids(pages, 1, n1 + BLOCK_N, n1 + BLOCK_N < end, BLOCK_SIZE)
            kv_next, pe_next = load_latent_tile(cache_ptr, blk, n1, n1 < end, s_b, s_t, s_d, R, ROPE, BLOCK_SIZE,
                                                R_PAD, PE_PAD)
            m, den, acc = attend_latent(q, q_pe, kv, pe, (n < end)[None, :], m, den, acc, qk, F8_BITS)
            kv, pe, blk = kv_next, pe_next, blk_next
    else:
        for n0 in range(start, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n_mask = n < end
            # page ids one tile ahead (see attention_common.load_block_ids: keeps the pipeliner's buffers)
            blk_next = load_block_ids(pages, 1, n + BLOCK_N, n + BLOCK_N < end, BLOCK_SIZE)
            kv, pe = load_latent_tile(cache_ptr, blk, n, n_mask, s_b, s_t, s_d, R, ROPE, BLOCK_SIZE, R_PAD, PE_PAD)
            m, den, acc = attend_latent(q, q_pe, kv, pe, n_mask[None, :], m, den, acc, qk, F8_BITS)
            blk = blk_next
    if HAS_SCALE:
        acc = acc * tl.load(scale_ptr).to(tl.float32)
    if F8_BITS:
        acc = acc * 256.0
    o = acc / tl.where(den > 0, den, 1.0)[:, None]
    c = tl.arange(0, R_PAD)
    o_mask = h_mask[:, None] & (c < R)[None, :]
    if SPLIT:  # partials [num_seqs, heads, num_splits, R] and their lse [num_seqs, heads, num_splits]
        prow = (seq * num_heads + heads).to(tl.int64) * num_splits + split
        tl.store(po_ptr + prow[:, None] * R + c[None, :], o, mask=o_mask)
        lse = tl.where(den > 0, m + tl.log2(den), float("-inf"))
        tl.store(plse_ptr + prow, lse, mask=h_mask)
    else:
        out = out_ptr + q_start * so_t + heads[:, None] * so_h + c[None, :] * so_d
        tl.store(out, o.to(out_ptr.dtype.element_ty), mask=o_mask)


# Programs per SM the split count aims for (attention_decode measured 2 to saturate HBM with its kernel).
PROGRAMS_PER_SM = 2
MAX_HEADS_PER_PROGRAM = 64  # [64, 512] float32 accumulator: 128 registers a thread at 8 warps
WGMMA_SMEM = 229900  # bytes of shared memory mla.decode_hopper's kernel takes (its compiled metadata, sm_90)


def mla_decode_config(num_seqs: int, num_heads: int, max_seq_len: int, device, query_dtype, cache_dtype,
                      wgmma_shapes: bool) -> dict:
    """Heads per program, tile, warps, stages, split count and the fp8 options (sweep: benchmarks/mla_decode.py
    --sweep). cache_dtype: the latent cache's. wgmma_shapes: the arguments fit Hopper's kernels (wgmma_fits);
    decided here once, since the split count depends on the kernel (one wgmma program an SM). Where they fit they
    take every head count (faster than this module's kernel at each): mla.hopper_few_heads up to 32 heads,
    mla.decode_hopper above.

    float32 queries (parity tests) take 16 heads and 16-row tiles: IEEE fp32 dots need twice the registers.
    16-bit queries, the fastest configs of the sweep (docs/kernels/mla.md has its timings): up to 16 heads, 32-row
    tiles 3 stages deep; with an e4m3 cache there, the prefetched tile and the integer upcast together (module
    docstring); 64 heads, 64-row tiles 2 deep (prefetch and f8_bits gain nothing there), which need ~220 KB of
    shared memory: where the GPU has less, and at 32 heads (not swept), 32-row tiles 2 deep.
    """
    fp32 = query_dtype == torch.float32
    block_h = min(pow2(num_heads, 16), 16 if fp32 else MAX_HEADS_PER_PROGRAM)
    smem = shared_memory(device)
    fp8_prefetch = not fp32 and block_h <= 16 and cache_dtype == torch.float8_e4m3fn
    if fp32:
        block_n, stages = 16, 1
    elif fp8_prefetch:
        block_n, stages = 32, 1  # the prefetch is the pipeline (the compiled code is the same at 3 stages)
    elif block_h <= 16:
        block_n, stages = 32, 3 if smem >= 160 << 10 else 2
    elif block_h == 64 and smem >= 220 << 10:
        block_n, stages = 64, 2
    else:
        block_n, stages = 32, 2
    warps = 4 if block_h <= 16 else 8
    wgmma = wgmma_shapes and hopper(device)
    programs = num_seqs * triton.cdiv(num_heads, block_h)
    splits = pick_splits(programs, resident_programs(wgmma, device), triton.cdiv(max(max_seq_len, 1), 256))
    return dict(block_h=block_h, block_n=block_n, num_warps=warps, num_stages=stages, num_splits=splits,
                prefetch=fp8_prefetch, f8_bits=fp8_prefetch, wgmma=wgmma)


def resident_programs(wgmma: bool, device) -> int:
    """Decode programs the GPU runs at once: the wgmma kernels' 165-225 KB of shared memory allow one an SM."""
    return (1 if wgmma else PROGRAMS_PER_SM) * num_sms(device)


@functools.cache
def hopper(device: torch.device) -> bool:
    """sm_90 with room for the wgmma kernels' shared memory (mla.decode_hopper's ~225 KB, the most; wgmma is
    Hopper's alone)."""
    return (GLUON_HOPPER and device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)
            and shared_memory(device) >= WGMMA_SMEM)


@functools.cache
def shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one program may use on this GPU (0 off CUDA: the interpreter on CPU tensors)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def launch_mla_decode(query, cache, kv_indptr, kv_indices, seq_lens, query_start_loc, qk_scale, kv_lora_rank,
                      cache_scale, out, block_h, block_n, num_warps, num_stages, num_splits, prefetch=False,
                      f8_bits=False, wgmma=False, order=None) -> None:
    """Run the decode kernel (+ merge) for the one-token sequences of the batch; arguments pre-checked.

    prefetch: the next latent tile loaded into registers ahead of the dots (any cache dtype); f8_bits: the
    integer e4m3 -> fp16 upcast (fp8 caches only, ignored for others). See the module docstring. wgmma: Hopper's
    kernels where they fit the arguments, by head count (mla.hopper_few_heads up to 32 heads, mla.decode_hopper
    above; the tile settings are theirs); mla_decode_config says when. order: attention_decode.decode_order's
    permutation (None: batch order).
    """
    num_seqs = seq_lens.shape[0]
    check_grid_seqs(num_seqs)
    _, heads, width = query.shape
    r_pad = pow2(kv_lora_rank, 16)
    split = num_splits > 1
    po = plse = out
    if split:
        po = torch.empty((num_seqs, heads, num_splits, kv_lora_rank), dtype=torch.float32, device=query.device)
        plse = torch.empty((num_seqs, heads, num_splits), dtype=torch.float32, device=query.device)
    scaled = cache_scale is not None
    launch = pdl(query.device)
    ordered = order_args(order, seq_lens)
    if wgmma:
        check(wgmma_fits(query, cache, kv_lora_rank, out), "wgmma=True for arguments the wgmma kernels do not take "
              "(see mla.decode_hopper.wgmma_fits); let mla_decode_config decide")
        kernel = launch_mla_decode_few_heads if heads <= FEW_HEADS else launch_mla_decode_wgmma
        kernel(query, cache, kv_indptr, kv_indices, seq_lens, query_start_loc, qk_scale, kv_lora_rank, cache_scale,
               out, po, plse, num_splits, ordered, launch)
    else:
        _mla_decode_kernel[(triton.cdiv(heads, block_h), num_splits, num_seqs)](
            query, cache, kv_indptr, kv_indices, seq_lens, query_start_loc, ordered[0],
            cache_scale if scaled else query, out, po, plse, qk_scale, num_splits, ordered[1], heads, kv_lora_rank,
            width - kv_lora_rank,
            *query.stride(), *out.stride(), *cache.stride(),
            BLOCK_SIZE=cache.shape[1], BLOCK_H=block_h, BLOCK_N=block_n, R_PAD=r_pad,
            PE_PAD=pow2(width - kv_lora_rank, 16), HAS_SCALE=scaled, SPLIT=split,
            DOT_F16=cache.dtype.itemsize == 1 and query.dtype == torch.bfloat16, PREFETCH=prefetch,
            F8_BITS=f8_bits and cache.dtype == torch.float8_e4m3fn,
            num_warps=num_warps, num_stages=num_stages, **launch,
        )
    if split:
        _merge_kernel[(num_seqs, heads)](
            query_start_loc, po, plse, out, num_splits, *out.stride(), kv_lora_rank, heads,
            S_PAD=pow2(num_splits), D_PAD=r_pad, **launch,
        )
