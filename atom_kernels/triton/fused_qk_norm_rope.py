"""fused_qk_norm_rope_write_kv: Qwen3's per-head q/k RMSNorm + neox rotary + paged K/V write, one kernel.

Equals atom_kernels.reference.fused.fused_qk_norm_rope_write_kv (rms_norm → rotary → write_kv_cache),
with the same roundings: the normed q/k are rounded to their dtypes before the rotation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import (
    FLOAT_DTYPES,
    check,
    check_dtype,
    check_same_device,
    has_scales,
    pdl,
    pdl_prologue,
    pow2,
)
from atom_kernels.triton.kv_cache import check_caches, store_kv_row
from atom_kernels.triton.norm import TL_DTYPES, rms_scale
from atom_kernels.triton.rotary import apply_rope, check_rope_args, load_cos_sin, rope_offsets


@triton.jit
def _norm_rope_heads(x_ptr, t, sx_t, sx_h, heads, w_ptr, eps, cos, sin, d, partner, HEAD_DIM, HALF, ROT,
                     OUT_DTYPE: tl.constexpr, H_PAD: tl.constexpr):
    """Token t's heads of x [T, heads, HEAD_DIM] → rms-normed then rotated, [H_PAD, D_PAD] float32."""
    h = tl.arange(0, H_PAD)
    mask = (h[:, None] < heads) & (d[None, :] < HEAD_DIM)
    row = x_ptr + t * sx_t + h[:, None] * sx_h
    x = tl.load(row + d[None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(row + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]  # per head
    dmask = d < HEAD_DIM
    w = tl.load(w_ptr + d, mask=dmask, other=0.0)[None, :]
    wp = tl.load(w_ptr + partner, mask=dmask, other=0.0)[None, :]
    x_dtype = x_ptr.dtype.element_ty
    xn = rms_scale(x, w, rstd, x_dtype, OUT_DTYPE)
    xpn = rms_scale(xp, wp, rstd, x_dtype, OUT_DTYPE)
    return apply_rope(xn, xpn, cos, sin, d, HALF, ROT, OUT_DTYPE), h, mask


# Not specialized on alignment: positions and slot mapping, slices of a host's step buffers (see rotary, kv_cache).
@triton.jit(do_not_specialize=["pos_ptr", "slot_ptr"])
def _fused_kernel(
    pos_ptr, q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cache_ptr, qo_ptr, kc_ptr, vc_ptr, slot_ptr,
    k_scale_ptr, v_scale_ptr, eps,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, s_pos,
    skc_b, skc_t, skc_h, skc_d, svc_b, svc_t, svc_h, svc_d,
    q_heads, kv_heads, HEAD_DIM, HALF, ROT, BLOCK_SIZE,
    Q_DTYPE: tl.constexpr, K_DTYPE: tl.constexpr, QH_PAD: tl.constexpr, KH_PAD: tl.constexpr,
    D_PAD: tl.constexpr, HAS_SCALE: tl.constexpr, PDL: tl.constexpr,
):
    # One program per token: all query heads → q_out; all key heads (+ value) → the paged caches.
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, D_PAD)
    partner, cs_idx = rope_offsets(d, HALF, ROT)
    cos, sin = load_cos_sin(cache_ptr, pos, s_pos, cs_idx, d, HALF, ROT)
    q, h, mask = _norm_rope_heads(q_ptr, t, sq_t, sq_h, q_heads, qw_ptr, eps, cos, sin, d, partner,
                                  HEAD_DIM, HALF, ROT, Q_DTYPE, QH_PAD)
    tl.store(qo_ptr + (t * q_heads + h[:, None]) * HEAD_DIM + d[None, :], q.to(Q_DTYPE), mask=mask)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:  # (new names: a branch may not retype the q part's h/mask, whose head count differs)
        k, kh, kmask = _norm_rope_heads(k_ptr, t, sk_t, sk_h, kv_heads, kw_ptr, eps, cos, sin, d, partner,
                                        HEAD_DIM, HALF, ROT, K_DTYPE, KH_PAD)
        v = tl.load(v_ptr + t * sv_t + kh[:, None] * sv_h + d[None, :], mask=kmask, other=0.0).to(tl.float32)
        store_kv_row(k, v, slot, kc_ptr, vc_ptr, k_scale_ptr, v_scale_ptr, skc_b, skc_t, skc_h, skc_d,
                     svc_b, svc_t, svc_h, svc_d, kh, d, kmask, BLOCK_SIZE, HAS_SCALE)


def fused_qk_norm_rope_write_kv(positions, query, key, value, q_weight, k_weight, eps, cos_sin_cache,
                                k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    """query [T, H, d], key/value [T, KVH, d] (strided rows, contiguous head_dim) → rotated normed query
    [T, H, d] (new, dtype of q_weight·query); normed rotated key and value written at slot_mapping."""
    head_dim, rot = check_rope_args(positions, query, key, cos_sin_cache)
    t, q_heads, _ = query.shape
    kv_heads = key.shape[1]
    check(value.shape == key.shape and value.stride(2) == 1,
          f"value must be [tokens, kv_heads, head_dim] like key {tuple(key.shape)}, got {tuple(value.shape)}")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        check(w.shape == (head_dim,) and w.stride(0) == 1, f"{name} must be contiguous [{head_dim}]")
        check_dtype(name, w, FLOAT_DTYPES)
    check_caches(k_cache, v_cache, kv_heads, head_dim)
    check(slot_mapping.shape == (t,) and not slot_mapping.is_floating_point(),
          f"slot_mapping must be int [{t}]")
    check_same_device(query=query, value=value, q_weight=q_weight, k_weight=k_weight, k_cache=k_cache,
                      v_cache=v_cache, slot_mapping=slot_mapping, k_scale=k_scale, v_scale=v_scale)
    scaled = has_scales(k_scale, v_scale)
    q_dtype, k_dtype = torch.result_type(q_weight, query), torch.result_type(k_weight, key)
    q_out = torch.empty(query.shape, dtype=q_dtype, device=query.device)
    if t:
        _fused_kernel[(t,)](
            positions, query, key, value, q_weight, k_weight, cos_sin_cache, q_out, k_cache, v_cache,
            slot_mapping, k_scale if scaled else q_out, v_scale if scaled else q_out, float(eps),
            query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            cos_sin_cache.stride(0), *k_cache.stride(), *v_cache.stride(),
            q_heads, kv_heads, head_dim, rot // 2, rot, k_cache.shape[1],
            Q_DTYPE=TL_DTYPES[q_dtype], K_DTYPE=TL_DTYPES[k_dtype], QH_PAD=pow2(q_heads),
            KH_PAD=pow2(kv_heads), D_PAD=pow2(head_dim), HAS_SCALE=scaled, **pdl(query.device),
        )
    return q_out
