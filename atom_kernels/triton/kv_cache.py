"""write_kv_cache: scatter this step's K/V rows into a paged cache (any strides, fp8 with scales)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import (
    FLOAT_DTYPES,
    check,
    check_cache_dtype,
    check_dtype,
    check_same_device,
    has_scales,
    pdl,
    pdl_prologue,
    pow2,
)


@triton.jit
def store_kv_row(k, v, slot, kc_ptr, vc_ptr, k_scale_ptr, v_scale_ptr,
                 skc_b, skc_t, skc_h, skc_d, svc_b, svc_t, svc_h, svc_d,
                 h_offs, d_offs, mask, BLOCK_SIZE, HAS_SCALE: tl.constexpr):
    """Store one token's k, v [KVH_PAD, D_PAD] (float32) at `slot` (>= 0) of the paged caches."""
    block = (slot // BLOCK_SIZE).to(tl.int64)
    off = (slot % BLOCK_SIZE).to(tl.int64)
    if HAS_SCALE:
        # stored = x / scale, divided in float32 like the reference.
        k = k / tl.load(k_scale_ptr).to(tl.float32)
        v = v / tl.load(v_scale_ptr).to(tl.float32)
    kp = kc_ptr + block * skc_b + off * skc_t + h_offs[:, None] * skc_h + d_offs[None, :] * skc_d
    vp = vc_ptr + block * svc_b + off * svc_t + h_offs[:, None] * svc_h + d_offs[None, :] * svc_d
    tl.store(kp, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vp, v.to(vc_ptr.dtype.element_ty), mask=mask)


# slot_ptr is not specialized on its 16-byte alignment: it may be a slice of a host's step buffer at an offset
# that changes with the token count (a recompile mid-serving), and feeds one scalar load.
@triton.jit(do_not_specialize=["slot_ptr"])
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    sk_t, sk_h, sk_d, sv_t, sv_h, sv_d,
    skc_b, skc_t, skc_h, skc_d, svc_b, svc_t, svc_h, svc_d,
    BLOCK_SIZE, KV_HEADS, HEAD_DIM,
    KVH_PAD: tl.constexpr, D_PAD: tl.constexpr, HAS_SCALE: tl.constexpr, PDL: tl.constexpr,
):
    # One program per token: all its KV heads as a [KVH_PAD, D_PAD] tile.
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding token
        return
    h = tl.arange(0, KVH_PAD)
    d = tl.arange(0, D_PAD)
    mask = (h[:, None] < KV_HEADS) & (d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + t * sk_t + h[:, None] * sk_h + d[None, :] * sk_d, mask=mask).to(tl.float32)
    v = tl.load(v_ptr + t * sv_t + h[:, None] * sv_h + d[None, :] * sv_d, mask=mask).to(tl.float32)
    store_kv_row(k, v, slot, kc_ptr, vc_ptr, k_scale_ptr, v_scale_ptr,
                 skc_b, skc_t, skc_h, skc_d, svc_b, svc_t, svc_h, svc_d, h, d, mask, BLOCK_SIZE, HAS_SCALE)


def check_caches(k_cache: torch.Tensor, v_cache: torch.Tensor, kv_heads: int, head_dim: int) -> None:
    """Both caches: logical [num_blocks, block_size, kv_heads, head_dim] views of one dtype."""
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check(c.dim() == 4,
              f"{name} must be a [num_blocks, block_size, kv_heads, head_dim] view, got {tuple(c.shape)}")
        check(tuple(c.shape[2:]) == (kv_heads, head_dim),
              f"{name}: [.., kv_heads, head_dim] = {tuple(c.shape[2:])}, expected {(kv_heads, head_dim)}")
        check_cache_dtype(c)
    check(k_cache.shape[:2] == v_cache.shape[:2],
          f"k/v cache shapes differ: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
    check(k_cache.dtype == v_cache.dtype, f"k/v cache dtypes differ: {k_cache.dtype} vs {v_cache.dtype}")


def write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """key/value [T, kv_heads, d] → caches [num_blocks, block_size, kv_heads, d] at slot_mapping [T]."""
    check(key.dim() == 3 and key.shape == value.shape,
          f"key/value must be [tokens, kv_heads, head_dim], got {tuple(key.shape)} / {tuple(value.shape)}")
    t, kv_heads, head_dim = key.shape
    check_dtype("key", key, FLOAT_DTYPES)
    check(value.dtype == key.dtype, f"value dtype {value.dtype} != key dtype {key.dtype}")
    check_caches(k_cache, v_cache, kv_heads, head_dim)
    check(slot_mapping.shape == (t,), f"slot_mapping must be [{t}], got {tuple(slot_mapping.shape)}")
    check(not slot_mapping.is_floating_point(), "slot_mapping must be an integer tensor")
    check_same_device(key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping,
                      k_scale=k_scale, v_scale=v_scale)
    scaled = has_scales(k_scale, v_scale)
    if t == 0:
        return
    _write_kv_kernel[(t,)](
        key, value, k_cache, v_cache, slot_mapping, k_scale if scaled else key, v_scale if scaled else key,
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(),
        k_cache.shape[1], kv_heads, head_dim,
        KVH_PAD=pow2(kv_heads), D_PAD=pow2(head_dim), HAS_SCALE=scaled, **pdl(key.device),
    )
