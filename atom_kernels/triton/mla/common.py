"""Pieces shared by the MLA decode and prefill kernels: latent tile loads and one online-softmax step.

The cache is a strided view of logical shape [num_blocks, block_size, R + ROPE]: per token the latent
(R = kv_lora_rank features, the values) then the shared rope key (ROPE features). Queries come as
[rows, R + ROPE] with W_UK already folded into the first R features. Logits = q[:R]·c + q[R:]·k_pe, so each
latent tile feeds both dots (as keys) and the output dot (as values): one read of the row serves all three.
R and ROPE need not be powers of two (a tiny model's 24 + 8): tiles are padded to R_PAD / PE_PAD and masked.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_query(q_ptr, rows, heads, row_mask, sq_t, sq_h, sq_d, R, ROPE, R_PAD: tl.constexpr, PE_PAD: tl.constexpr):
    """Query rows (token rows [M] int64, heads [M]) → (q_nope [M, R_PAD], q_pe [M, PE_PAD]), 0 where masked."""
    c = tl.arange(0, R_PAD)
    e = tl.arange(0, PE_PAD)
    base = q_ptr + rows[:, None] * sq_t + heads[:, None] * sq_h
    q = tl.load(base + c[None, :] * sq_d, mask=row_mask[:, None] & (c < R)[None, :], other=0.0)
    q_pe = tl.load(base + (R + e)[None, :] * sq_d, mask=row_mask[:, None] & (e < ROPE)[None, :], other=0.0)
    return q, q_pe


@triton.jit
def load_latent_tile(cache_ptr, blk, n, n_mask, s_b, s_t, s_d, R, ROPE,
                     BLOCK_SIZE: tl.constexpr, R_PAD: tl.constexpr, PE_PAD: tl.constexpr):
    """Tokens n [N] in blocks blk [N] → (latent [N, R_PAD], rope key [N, PE_PAD]), cache dtype, 0 where masked."""
    c = tl.arange(0, R_PAD)
    e = tl.arange(0, PE_PAD)
    row = cache_ptr + blk * s_b + (n % BLOCK_SIZE).to(tl.int64) * s_t
    kv = tl.load(row[:, None] + c[None, :] * s_d, mask=n_mask[:, None] & (c < R)[None, :], other=0.0)
    pe = tl.load(row[:, None] + (R + e)[None, :] * s_d, mask=n_mask[:, None] & (e < ROPE)[None, :], other=0.0)
    return kv, pe


@triton.jit
def e4m3_bits_as_f16(x):
    """e4m3 tile → fp16 tile holding exactly x / 256, by integer ops instead of the F2FP conversion.

    fp16 bits = ((x & 0x7F) << 7) | ((x & 0x80) << 8): e4m3's exponent and mantissa bits (bias 7) land under
    fp16's (bias 15), a factor 2^-8 for every finite value, subnormals included (a NaN byte turns into +-1.875,
    so a NaN in the cache does not propagate). Here in two ops: the byte sign-extended to 16 bits, shifted by 7
    (the sign lands on bits 15 and 14), bit 14 cleared.
    """
    x16 = x.to(tl.int8, bitcast=True).to(tl.int16).to(tl.uint16, bitcast=True)
    return ((x16 << 7) & 0xBF80).to(tl.float16, bitcast=True)


@triton.jit
def attend_latent(q, q_pe, kv, pe, valid, m, den, acc, qk_scale, F8_BITS: tl.constexpr = False):
    """One flash-attention step in the log2 domain over a latent tile.

    q [M, R_PAD], q_pe [M, PE_PAD] (dot dtype); kv [N, R_PAD], pe [N, PE_PAD] (cache dtype, upcast to the dot
    dtype: exact for fp8); valid [M, N]; m, den [M], acc [M, R_PAD] float32. m starts finite (-1e30) so a row
    whose keys are all masked in a tile keeps p = 0 instead of NaN. F8_BITS (e4m3 tiles): upcast by
    e4m3_bits_as_f16, so the caller multiplies qk_scale and the final acc by 256 (exact: a power of two).
    """
    dot_dtype = q.dtype
    if F8_BITS:
        kv = e4m3_bits_as_f16(kv)
        pe = e4m3_bits_as_f16(pe)
    kv = kv.to(dot_dtype)
    s = tl.dot(q, tl.trans(kv), input_precision="ieee")
    s = tl.dot(q_pe, tl.trans(pe.to(dot_dtype)), s, input_precision="ieee")
    s = tl.where(valid, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    den = den * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(dot_dtype), kv, input_precision="ieee")
    return m_new, den, acc

