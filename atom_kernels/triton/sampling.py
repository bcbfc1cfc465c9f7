"""sample_tokens on the GPU: greedy or Gumbel-max sampling of one token per row, the logits read once.

The contract and the maths are atom_kernels.reference.sampling's: temperature 0 → argmax (first index of the
maximum); t > 0 → argmax_v(logits[v] * (1 / t) - log(-log(u_v))), u from `tl.randint4x(seed, i)` (Philox-4x32-10)
where token v takes word v // V4 of counter v % V4, V4 = ceil(V / 4), clamped to [U_MIN, U_MAX].

Work split. Philox costs ~60 integer instructions per call, more than the load of a bf16 logit, so each call
serves four tokens, one per quarter of the vocabulary: the four loads of an iteration stay contiguous (coalesced),
and the counter of a token does not depend on any tile size. A row's counters are cut into `chunks` contiguous
ranges, one program each (grid [N, chunks]); a program keeps a running (best score, its token) per lane over its
range and writes the range's (max, first argmax); a second kernel reduces the partials of each row. `chunks` is
picked from N alone so that N * chunks is about PROGRAMS_PER_SM programs per SM: at N = 1 the vocabulary
(151936: 75 tiles of 512 counters) is spread over 75 programs instead of one SM walking 300 KB, and at N = 256 each
row is 3 programs of 25 tiles (768 programs, no tail of idle SMs behind a few long rows).

No host sync, no data-dependent allocation (the partials are [N, chunks] from shapes): CUDA-graph capturable. A
greedy row skips Philox and the logs altogether (a branch on the row's temperature, uniform per program).
NaN logits are not supported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.reference.sampling import U_MAX, U_MIN
from atom_kernels.triton._utils import FLOAT_DTYPES, check, check_dtype, check_same_device, pdl, pdl_prologue, pow2
from atom_kernels.triton.attention.decode import num_sms

TILE = 512  # Philox counters (4 * TILE tokens) per iteration: 4 per thread with 4 warps
PROGRAMS_PER_SM = 4  # small programs: several resident per SM hide the loads' latency behind the others' Philox
_INT_MAX = tl.constexpr(2**31 - 1)
_U_MIN, _U_MAX = tl.constexpr(U_MIN), tl.constexpr(U_MAX)


@triton.jit
def _better(best, best_v, score, v):
    """Lane-wise running argmax: take a larger score, or an equal one at a smaller token (the four quarters of
    one iteration are not visited in token order, so ties are settled by index, not by arrival)."""
    take = (score > best) | ((score == best) & (v < best_v))
    return tl.where(take, score, best), tl.where(take, v, best_v)


@triton.jit
def _visit(best, best_v, row_ptr, i, ok, word, inv_t, V, V4, Q: tl.constexpr, SAMPLE: tl.constexpr):
    """Fold the quarter-Q tokens v = Q * V4 + i (i: [TILE] counters, `word` their Philox word Q) into the lanes."""
    v = Q * V4 + i
    x = tl.load(row_ptr + v, mask=ok & (v < V), other=float("-inf")).to(tl.float32)
    if SAMPLE:
        u = tl.minimum(tl.maximum(tl.uint_to_uniform_float(word), _U_MIN), _U_MAX)
        x = x * inv_t - tl.log(-tl.log(u))
    return _better(best, best_v, x, v)


@triton.jit
def _scan(row_ptr, seed, inv_t, first, last, V, V4, SAMPLE: tl.constexpr, TILE: tl.constexpr):
    """(best score, its token) per lane over counters [first, last) of one row: [TILE] float32, [TILE] int32."""
    best = tl.full([TILE], float("-inf"), tl.float32)
    best_v = tl.zeros([TILE], tl.int32)
    for start in range(first, last, TILE):
        i = start + tl.arange(0, TILE)
        ok = i < last
        if SAMPLE:
            w0, w1, w2, w3 = tl.randint4x(seed, i)
        else:  # no noise: the words are not read
            w0, w1, w2, w3 = i, i, i, i
        best, best_v = _visit(best, best_v, row_ptr, i, ok, w0, inv_t, V, V4, 0, SAMPLE)
        best, best_v = _visit(best, best_v, row_ptr, i, ok, w1, inv_t, V, V4, 1, SAMPLE)
        best, best_v = _visit(best, best_v, row_ptr, i, ok, w2, inv_t, V, V4, 2, SAMPLE)
        best, best_v = _visit(best, best_v, row_ptr, i, ok, w3, inv_t, V, V4, 3, SAMPLE)
    return best, best_v


@triton.jit(do_not_specialize=["num_chunks"])  # set by N: no variant per batch size
def _partial_kernel(logits_ptr, stride, temp_ptr, seed_ptr, part_val_ptr, part_idx_ptr, V, V4, per_chunk,
                    num_chunks, TILE: tl.constexpr, PDL: tl.constexpr):
    # grid (N, chunks): program (r, c) scans counters [c * per_chunk, (c + 1) * per_chunk) of row r and writes the
    # range's max score and its first token into part_val / part_idx [N, chunks].
    pdl_prologue(PDL)
    row, chunk = tl.program_id(0), tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    first = chunk * per_chunk
    last = tl.minimum(first + per_chunk, V4)
    temp = tl.load(temp_ptr + row)
    if temp > 0:
        inv_t = tl.div_rn(1.0, temp)  # IEEE, as the reference's division (Triton's `/` is approximate)
        best, best_v = _scan(row_ptr, tl.load(seed_ptr + row), inv_t, first, last, V, V4, True, TILE)
    else:
        best, best_v = _scan(row_ptr, 0, 1.0, first, last, V, V4, False, TILE)
    top = tl.max(best, axis=0)
    # all -inf: every lane ties at token 0 (its initial value), as torch.argmax answers for such a row
    top_v = tl.min(tl.where(best == top, best_v, _INT_MAX), axis=0)
    tl.store(part_val_ptr + row * num_chunks + chunk, top)
    tl.store(part_idx_ptr + row * num_chunks + chunk, top_v)


@triton.jit(do_not_specialize=["num_chunks"])
def _reduce_kernel(part_val_ptr, part_idx_ptr, out_ptr, num_chunks, CHUNKS: tl.constexpr, PDL: tl.constexpr):
    # grid (N,): the first token of the row's maximum over its chunks' partials.
    pdl_prologue(PDL)
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS)
    ok = c < num_chunks
    val = tl.load(part_val_ptr + row * num_chunks + c, mask=ok, other=float("-inf"))
    idx = tl.load(part_idx_ptr + row * num_chunks + c, mask=ok, other=_INT_MAX)
    top = tl.max(val, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(val == top, idx, _INT_MAX), axis=0).to(tl.int64))


def split(num_rows: int, vocab: int, device: torch.device) -> tuple[int, int]:
    """(counters per program, programs per row) for [num_rows, vocab] logits: whole tiles per program, about
    PROGRAMS_PER_SM programs per SM in all (never fewer than one per row, never more than one per tile)."""
    tiles = triton.cdiv(triton.cdiv(vocab, 4), TILE)
    want = max(1, min(tiles, triton.cdiv(PROGRAMS_PER_SM * num_sms(device), num_rows)))
    per_chunk = triton.cdiv(tiles, want) * TILE
    return per_chunk, triton.cdiv(triton.cdiv(vocab, 4), per_chunk)


def sample_tokens(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """logits [N, V] (bf16/fp16/fp32, unit column stride), temperature [N] float32 (0 = greedy), seeds [N] int64
    → [N] int64 tokens (see the module docstring)."""
    check(logits.dim() == 2 and logits.stride(1) == 1, f"logits must be [N, V] with unit column stride, "
          f"got shape {tuple(logits.shape)} strides {logits.stride()}")
    check_dtype("logits", logits, FLOAT_DTYPES)
    n, vocab = logits.shape
    check(temperature.shape == (n,) and temperature.dtype == torch.float32 and temperature.is_contiguous(),
          f"temperature must be a contiguous [{n}] float32 tensor")
    check(seeds.shape == (n,) and seeds.dtype == torch.int64 and seeds.is_contiguous(),
          f"seeds must be a contiguous [{n}] int64 tensor")
    check(0 < vocab < 2**31 - 4 * TILE, f"vocabulary size {vocab} out of range")
    check_same_device(logits=logits, temperature=temperature, seeds=seeds)
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n == 0:
        return out
    per_chunk, chunks = split(n, vocab, logits.device)
    part_val = torch.empty(n, chunks, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(n, chunks, dtype=torch.int32, device=logits.device)
    launch = pdl(logits.device)
    _partial_kernel[(n, chunks)](logits, logits.stride(0), temperature, seeds, part_val, part_idx, vocab,
                                 triton.cdiv(vocab, 4), per_chunk, chunks, TILE=TILE, num_warps=4,
                                 **launch)
    _reduce_kernel[(n,)](part_val, part_idx, out, chunks, CHUNKS=pow2(chunks, 2), num_warps=1,
                         **launch)
    return out
