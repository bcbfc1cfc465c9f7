"""The native engine's CPU kernels: its GEMM (cpu_linear.py) and float32 versions of the ops around it that give
the torch reference's results bit for bit with fewer torch calls.

A decode step of a small model on CPU is bound by the number of torch calls (each costs about the same whatever
its size; docs/kernels/norm-rope-activation.md), not by their arithmetic. So these kernels run the reference's
arithmetic in fewer calls: torch.rms_norm (the reference's pow / mean / rsqrt / mul in one call, the same float32
operations in the same order), q and k heads normed and rotated as one tensor, the rotation as one product with
the half-swapped heads (x2 * -sin instead of -x2 * sin: the same float), the KV cache written with index_copy_
into its slot rows instead of a masked advanced-index assignment. tests/frontends/native/test_cpu_kernels.py
checks each against the reference with torch.equal.

Inputs these do not cover (other dtypes, fp8 cache scales, partial rotary, padding slots) run the reference.
register_host_kernels makes them (and the GEMM) the dispatcher's "host" kernels on CPU, as the vLLM frontend
does with vLLM's kernels; ATOM_KERNEL_BACKEND=torch runs the reference instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from atom_frontends.native import cpu_linear
from atom_kernels import dispatch, reference
from atom_kernels.reference.attention import slot_rows

HOST_KERNELS = {
    **cpu_linear.HOST_KERNELS,
    "rms_norm": f"{__name__}:rms_norm",
    "rms_norm_linear": f"{__name__}:rms_norm_linear",
    "silu_and_mul_linear": f"{__name__}:silu_and_mul_linear",
    "write_kv_cache": f"{__name__}:write_kv_cache",
    "fused_qk_norm_rope_write_kv": f"{__name__}:fused_qk_norm_rope_write_kv",
}


def register_host_kernels(device: torch.device) -> None:
    """On a CPU: make these the "host" kernels of their ops (idempotent), except where another host's kernel
    serves an op (vLLM's, inside vLLM; a test's broken op). Other devices keep theirs."""
    if device.type != "cpu":
        return
    for op, target in HOST_KERNELS.items():
        if dispatch.host_kernel(op) is None:
            dispatch.register(op, "host", target, device_type="cpu")


def _f32(*tensors: torch.Tensor) -> bool:
    for t in tensors:
        if t.dtype != torch.float32:
            return False
    return True


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """As reference.rms_norm: x [..., hidden] → norm(x), or with residual (norm(x + residual), x + residual)."""
    if not _f32(x, weight):
        return reference.rms_norm(x, weight, eps, residual)
    if residual is not None:
        x = residual = x + residual
    out = torch.rms_norm(x, (x.shape[-1],), weight, eps)
    return out if residual is None else (out, residual)


def rms_norm_linear(x, residual, norm_weight, eps: float, weight, bias=None, packed=None):
    """As reference.rms_norm_linear: (linear(rms_norm(x + residual)), x + residual); residual None: x."""
    if residual is None:
        h, residual = rms_norm(x, norm_weight, eps), x
    else:
        h, residual = rms_norm(x, norm_weight, eps, residual)
    return cpu_linear.linear(h, weight, bias, packed), residual


def silu_and_mul_linear(x, weight, bias=None, packed=None):
    """As reference.silu_and_mul_linear: x [..., 2K] (gate | up) → linear(silu(gate) * up), the product made in
    silu's output."""
    gate, up = x.chunk(2, dim=-1)
    return cpu_linear.linear(F.silu(gate).mul_(up), weight, bias, packed)


def write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """As reference.write_kv_cache: key/value [T, kv_heads, d] into the caches' slots, each a row of the caches'
    slot_rows views (the reference serves fp8 scales, padding slots -1 and caches whose blocks are not back to
    back)."""
    (k_rows, pitch), (v_rows, v_pitch) = slot_rows(k_cache), slot_rows(v_cache)
    if (k_scale is not None or not _f32(key, value, k_cache, v_cache) or not pitch == v_pitch == k_cache.shape[1]
            or not len(slot_mapping) or slot_mapping.min().item() < 0):
        return reference.write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    slots = slot_mapping.long()
    k_rows.index_copy_(0, slots, key)
    v_rows.index_copy_(0, slots, value)


def fused_qk_norm_rope_write_kv(positions, query, key, value, q_weight, k_weight, eps: float, cos_sin_cache,
                                k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> torch.Tensor:
    """As reference.fused_qk_norm_rope_write_kv: query [T, heads, d], key/value [T, kv_heads, d] → the normed,
    rotated query; the normed, rotated key and the value written into the caches."""
    (t, heads, d), kv_heads = query.shape, key.shape[1]
    if not _f32(query, key, q_weight, k_weight, cos_sin_cache) or k_scale is not None or cos_sin_cache.shape[-1] != d:
        return reference.fused_qk_norm_rope_write_kv(positions, query, key, value, q_weight, k_weight, eps,
                                                     cos_sin_cache, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    # Per-head RMSNorm of q and k heads together ([T, heads + kv_heads, d]), then each head's weight.
    x = torch.rms_norm(torch.cat((query, key), dim=1), (d,), None, eps)
    x = x * torch.cat((q_weight.expand(heads, d), k_weight.expand(kv_heads, d)))
    # Neox rotary: (x1, x2) → (x1 * cos - x2 * sin, x2 * cos + x1 * sin), both halves at once over [..., 2, d/2]
    # views: x * cos + (x2, x1) * (-sin, sin).
    cos, sin = cos_sin_cache[positions].view(t, 1, 2, d // 2).unbind(2)  # [T, 1, d/2] each
    halves = x.view(t, heads + kv_heads, 2, d // 2)
    swapped = halves.roll(1, 2)  # (x2, x1): a roll by one of two is a flip, and much faster than flip
    y = (halves * cos.unsqueeze(2) + swapped * torch.stack((-sin, sin), dim=2)).view(t, heads + kv_heads, d)
    write_kv_cache(y[:, heads:], value, k_cache, v_cache, slot_mapping)
    return y[:, :heads]
