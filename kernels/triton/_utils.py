"""Launcher helpers shared by the Triton ops: argument checks and small size rules."""

from __future__ import annotations

import torch
import triton

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FP8_DTYPES = (torch.float8_e4m3fn,)


def check(cond: bool, msg: str) -> None:
    """Launcher argument check: a clear ValueError instead of a wrong result or an illegal access."""
    if not cond:
        raise ValueError(msg)


def check_dtype(name: str, t: torch.Tensor, allowed) -> None:
    check(t.dtype in allowed, f"{name}: dtype {t.dtype} not supported; expected one of {allowed}")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    check(len(set(devices.values())) <= 1, f"tensors on different devices: {devices}")


def has_scales(k_scale, v_scale) -> bool:
    """Per-tensor K/V scales (stored = x / scale), as the references apply them: both or neither."""
    check((k_scale is None) == (v_scale is None), "give both k_scale and v_scale, or neither")
    if k_scale is None:
        return False
    check(k_scale.numel() == 1 and v_scale.numel() == 1, "k_scale/v_scale must be per-tensor (one element)")
    return True


def check_cache_dtype(cache: torch.Tensor) -> None:
    check_dtype("kv cache", cache, FLOAT_DTYPES + FP8_DTYPES)


def pow2(n: int, minimum: int = 1) -> int:
    return max(triton.next_power_of_2(int(n)), minimum)
