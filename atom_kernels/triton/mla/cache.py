"""write_latent_cache: scatter this step's MLA latent rows into a paged latent cache (any strides, fp8 with a scale).

Same contract as atom_kernels.reference.mla.write_latent_cache.
"""

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
    pdl,
    pdl_prologue,
    pow2,
)

ROWS_PER_PROGRAM = 4  # tokens per program: a 576-wide row is 1.1 KB in bf16, too little work for one program


@triton.jit(do_not_specialize=["num_tokens", "slot_ptr"])  # step-varying, as in write_kv_cache
def _write_latent_kernel(
    x_ptr, cache_ptr, slot_ptr, scale_ptr, num_tokens,
    sx_t, sx_d, sc_b, sc_t, sc_d,
    BLOCK_SIZE, WIDTH,
    ROWS: tl.constexpr, D_PAD: tl.constexpr, HAS_SCALE: tl.constexpr, PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    t_mask = t < num_tokens
    slot = tl.load(slot_ptr + t, mask=t_mask, other=-1).to(tl.int64)
    valid = slot >= 0  # -1: padding token, written nowhere
    d = tl.arange(0, D_PAD)
    mask = valid[:, None] & (d < WIDTH)[None, :]
    x = tl.load(x_ptr + t[:, None] * sx_t + d[None, :] * sx_d, mask=mask, other=0.0).to(tl.float32)
    if HAS_SCALE:
        x = x / tl.load(scale_ptr).to(tl.float32)  # stored = x / scale, in float32 like the reference
    block = tl.where(valid, slot // BLOCK_SIZE, 0)
    off = tl.where(valid, slot % BLOCK_SIZE, 0)
    dst = cache_ptr + block[:, None] * sc_b + off[:, None] * sc_t + d[None, :] * sc_d
    tl.store(dst, x.to(cache_ptr.dtype.element_ty), mask=mask)


def check_latent_cache(cache: torch.Tensor, width: int) -> None:
    check(cache.dim() == 3, f"latent cache must be a [num_blocks, block_size, r + rope] view, got {tuple(cache.shape)}"
                            " (vLLM's [blocks, 1, block_size, D] view: pass cache[:, 0])")
    check(cache.shape[2] == width, f"latent cache rows are {cache.shape[2]} wide, the latent/query rows {width}")
    check_cache_dtype(cache)


def check_cache_scale(scale: torch.Tensor | None) -> None:
    """The cache's optional per-tensor scale (stored = x / scale; None = 1, as in the reference)."""
    if scale is not None:
        check(scale.numel() == 1, f"the latent cache scale must be per-tensor (one element), got {tuple(scale.shape)}")


def write_latent_cache(latent, cache, slot_mapping, scale=None) -> None:
    """latent [T, r + rope] → cache [num_blocks, block_size, r + rope] at slot_mapping [T] (-1 = padding)."""
    check(latent.dim() == 2, f"latent must be [tokens, r + rope], got {tuple(latent.shape)}")
    check_dtype("latent", latent, FLOAT_DTYPES)
    t, width = latent.shape
    check_latent_cache(cache, width)
    check_cache_scale(scale)
    check(slot_mapping.shape == (t,) and not slot_mapping.is_floating_point(),
          f"slot_mapping must be int [{t}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    check_same_device(latent=latent, cache=cache, slot_mapping=slot_mapping, scale=scale)
    if t == 0:
        return
    _write_latent_kernel[(triton.cdiv(t, ROWS_PER_PROGRAM),)](
        latent, cache, slot_mapping, latent if scale is None else scale, t,
        *latent.stride(), *cache.stride(), cache.shape[1], width,
        ROWS=ROWS_PER_PROGRAM, D_PAD=pow2(width, 16), HAS_SCALE=scale is not None, **pdl(latent.device),
    )
