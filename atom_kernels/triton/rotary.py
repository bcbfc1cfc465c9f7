"""Neox-style rotary embedding on query and key heads, with a [max_pos, rot_dim] cos|sin cache."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import FLOAT_DTYPES, check, check_dtype, check_same_device, pdl, pdl_prologue, pow2
from atom_kernels.triton.norm import TL_DTYPES


@triton.jit
def rope_offsets(d, HALF, ROT):
    """Per feature d: (index of the partner feature, index into the cos/sin halves)."""
    partner = tl.where(d < HALF, d + HALF, tl.where(d < ROT, d - HALF, d))
    return partner, tl.where(d < ROT, d % HALF, 0)


@triton.jit
def apply_rope(x, xp, cos, sin, d, HALF, ROT, DTYPE: tl.constexpr):
    """x, xp: [heads, D] float32 (features and their partners); cos, sin: [D] float32.

    y = x*cos - partner*sin on the first half, x*cos + partner*sin on the second, x past rot_dim;
    cos/sin, products and sum rounded to DTYPE like the reference. (For 16-bit DTYPEs LLVM may still
    fuse the first product and the sum into one FMA, skipping that product's rounding: an ulp apart.)
    Returns float32 holding DTYPE values.
    """
    c = cos.to(DTYPE).to(tl.float32)[None, :]
    s = sin.to(DTYPE).to(tl.float32)[None, :]
    rot = tl.where(d[None, :] < HALF, -xp, xp)
    y = (x * c).to(DTYPE).to(tl.float32) + (rot * s).to(DTYPE).to(tl.float32)
    return tl.where(d[None, :] < ROT, y.to(DTYPE).to(tl.float32), x)


@triton.jit
def load_cos_sin(cache_ptr, pos, s_pos, cs_idx, d, HALF, ROT):
    row = cache_ptr + pos * s_pos
    valid = d < ROT
    return (tl.load(row + cs_idx, mask=valid, other=1.0).to(tl.float32),
            tl.load(row + HALF + cs_idx, mask=valid, other=0.0).to(tl.float32))


@triton.jit
def _rope_heads(x_ptr, o_ptr, t, sx_t, sx_h, heads, cos, sin, d, partner, HEAD_DIM, HALF, ROT,
                H_PAD: tl.constexpr):
    """Rotate all heads of token t: x [T, heads, HEAD_DIM] (strided, last dim contiguous) → o (contiguous)."""
    h = tl.arange(0, H_PAD)
    mask = (h[:, None] < heads) & (d[None, :] < HEAD_DIM)
    row = x_ptr + t * sx_t + h[:, None] * sx_h
    x = tl.load(row + d[None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(row + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    y = apply_rope(x, xp, cos, sin, d, HALF, ROT, o_ptr.dtype.element_ty)
    out = o_ptr + (t * heads + h[:, None]) * HEAD_DIM + d[None, :]
    tl.store(out, y.to(o_ptr.dtype.element_ty), mask=mask)


# pos_ptr is not specialized on its 16-byte alignment: the native runner's positions are a slice of its step
# buffer at an offset of 8 * num_tokens bytes (a recompile whenever the parity of the token count changes).
@triton.jit(do_not_specialize=["pos_ptr"])
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, qo_ptr, ko_ptr, cache_ptr,
    sq_t, sq_h, sk_t, sk_h, s_pos, q_heads, k_heads, HEAD_DIM, HALF, ROT,
    QH_PAD: tl.constexpr, KH_PAD: tl.constexpr, D_PAD: tl.constexpr, PDL: tl.constexpr,
):
    # One program per token: all query heads, then all key heads.
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, D_PAD)
    partner, cs_idx = rope_offsets(d, HALF, ROT)
    cos, sin = load_cos_sin(cache_ptr, pos, s_pos, cs_idx, d, HALF, ROT)
    _rope_heads(q_ptr, qo_ptr, t, sq_t, sq_h, q_heads, cos, sin, d, partner, HEAD_DIM, HALF, ROT, QH_PAD)
    _rope_heads(k_ptr, ko_ptr, t, sk_t, sk_h, k_heads, cos, sin, d, partner, HEAD_DIM, HALF, ROT, KH_PAD)


def check_rope_args(positions, query, key, cos_sin_cache) -> tuple[int, int]:
    """Shared checks of rotary and the fused op; returns (head_dim, rot_dim)."""
    check(query.dim() == 3 and key.dim() == 3, "query/key must be [tokens, heads, head_dim]")
    t, _, head_dim = query.shape
    check(key.shape[0] == t and key.shape[2] == head_dim,
          f"key {tuple(key.shape)} does not match query {tuple(query.shape)} in tokens/head_dim")
    check(positions.shape == (t,) and not positions.is_floating_point(), f"positions must be int [{t}]")
    check(cos_sin_cache.dim() == 2 and cos_sin_cache.stride(1) == 1,
          "cos_sin_cache must be [max_pos, rot_dim] with contiguous rows")
    rot = cos_sin_cache.shape[1]
    check(rot % 2 == 0 and rot <= head_dim, f"rot_dim {rot} must be even and <= head_dim {head_dim}")
    check(query.stride(2) == 1 and key.stride(2) == 1, "query/key need a contiguous head_dim")
    check_dtype("query", query, FLOAT_DTYPES)
    check_dtype("key", key, FLOAT_DTYPES)
    check_same_device(positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache)
    return head_dim, rot


def rotary(positions, query, key, cos_sin_cache):
    """positions [T]; query [T, H, d]; key [T, KVH, d] → new rotated (query, key), contiguous."""
    head_dim, rot = check_rope_args(positions, query, key, cos_sin_cache)
    q_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    k_out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
    t = query.shape[0]
    if t:
        _rotary_kernel[(t,)](
            positions, query, key, q_out, k_out, cos_sin_cache,
            query.stride(0), query.stride(1), key.stride(0), key.stride(1), cos_sin_cache.stride(0),
            query.shape[1], key.shape[1], head_dim, rot // 2, rot,
            QH_PAD=pow2(query.shape[1]), KH_PAD=pow2(key.shape[1]), D_PAD=pow2(head_dim), **pdl(query.device),
        )
    return q_out, k_out


__all__ = ["rotary", "apply_rope", "rope_offsets", "load_cos_sin", "check_rope_args", "TL_DTYPES"]
