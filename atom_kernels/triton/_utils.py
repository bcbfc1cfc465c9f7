"""Launcher helpers shared by the Triton ops: argument checks, small size rules, programmatic dependent launch."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from atom_kernels import envs

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


def powers_of_two_up_to(top: int, start: int) -> list[int]:
    """start, 2 * start, ... below top, then top itself (top >= start): one value in every power-of-two bucket
    from start's to top's (consecutive powers are one bucket apart), the warm-up shapes of pow2-bucketed kernels."""
    out = []
    while start < top:
        out.append(start)
        start *= 2
    return [*out, top]


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    """First statement of a kernel launched with pdl(): wait until the kernels before it in the stream are done and
    their writes visible (no load or store may come earlier), then let the next kernel's programs be scheduled.

    Programmatic dependent launch (sm_90+): a decode step is hundreds of short kernels in a row, and without it each
    one is only set up on the GPU once the one before has drained. With it, the next kernel is launched while this
    one's last programs still run and waits here, so the launch latency overlaps the tail. Every kernel that waits
    first is safe behind any kernel; one that is not launched with pdl() waits for the whole kernel before it, as
    usual."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the 128-byte line at each pointer of `ptrs` (any shape). PTX prefetch: no register written, no
    fault, nothing waits for it. For weights, which no kernel writes, before pdl_prologue: a GEMV launched early
    waits there while the kernel before it finishes, and DRAM would idle for that time but for this."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


def prefetch(launch: dict) -> bool:
    """Whether the FP8 GEMV launched with `launch` (pdl()'s keywords) prefetches its first weight tiles (switch
    ATOM_PDL_PREFETCH): only behind a PDL wait."""
    return launch["PDL"] and envs.ATOM_PDL_PREFETCH


@functools.cache
def nvidia_sm90(index: int) -> bool:
    """CUDA device `index` is an NVIDIA GPU of compute capability 9 or newer (Hopper): programmatic dependent launch,
    TMA descriptors."""
    return torch.version.cuda is not None and torch.cuda.get_device_capability(index)[0] >= 9


def pdl(device: torch.device) -> dict:
    """Launch keywords for a kernel that starts with pdl_prologue: programmatic dependent launch on NVIDIA GPUs of
    compute capability 9 and up (switch ATOM_PDL, default 1), off elsewhere (AMD, the interpreter, the CPU)."""
    if device.type != "cuda" or not envs.ATOM_PDL or envs.TRITON_INTERPRET:
        return {"PDL": False}
    on = nvidia_sm90(torch.cuda.current_device() if device.index is None else device.index)
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}
