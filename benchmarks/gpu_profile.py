"""Where a GPU run's time goes: torch.profiler over one call, GPU kernels grouped by kind, the top kernels, and
the wall time next to the GPU time (a wall far above the GPU time with many launches means CPU-bound steps).

Shared by native_gpu.py and vllm_plugin_gpu.py (`--profile`). CUDA-graph replays count their kernels one by one.
"""

from __future__ import annotations

import re
import time

import torch

# (kind, pattern over the lower-cased kernel name); the first match wins, so the specific kinds come first.
KINDS = (
    ("inductor-fused", r"^triton_(poi|red|per)_"),
    ("moe", r"moe"),
    ("attention", r"attn|attention|paged|flash|mla_decode|mla_prefill|fmha|^_(decode|merge|prefill)_kernel"),
    ("kv-cache write", r"kv_cache|write_kv|reshape_and_cache|latent_cache"),
    ("qk-norm/rotary", r"rotary|rope|qk_norm|^_fused_kernel"),
    ("norm", r"norm"),
    ("activation", r"silu|gelu|act_and_mul"),
    ("gemm", r"gemm|gemv|matmul|cutlass|xmma|cublas|nvjet|sm\d+_"),
    ("sampling", r"softmax|argmax|argmin|topk|top_k|sort|sample|exponential|multinomial|max_"),
    ("copy/fill/index", r"copy|fill|memcpy|memset|cat_|index|gather|scatter|elementwise|vectorized"),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, pattern in KINDS if re.search(pattern, low)), "other")


def profile_call(fn, label: str, top: int = 10, host_top: int = 0) -> str:
    """Run fn() once under the profiler (CUDA synchronized before and after) → a few lines of text; host_top > 0
    adds that many CPU ops by self CPU time: where a CPU-bound step goes."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    wall = time.perf_counter() - t
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    gpu_us = sum(e.self_device_time_total for e in kernels)
    by_kind: dict[str, list[float]] = {}
    for e in kernels:
        acc = by_kind.setdefault(kind_of(e.key), [0.0, 0])
        acc[0] += e.self_device_time_total
        acc[1] += e.count
    lines = [f"{label}: wall {wall * 1e3:.1f} ms (profiler on), GPU kernels {gpu_us / 1e3:.2f} ms, "
             f"{sum(e.count for e in kernels)} kernel launches"]
    lines.append("  by kind: " + ", ".join(
        f"{kind} {us / 1e3:.2f} ms ({us / max(gpu_us, 1):.0%}, {n}x)"
        for kind, (us, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0])))
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:top]:
        lines.append(f"  {e.self_device_time_total / 1e3:8.3f} ms {e.count:6d}x {kind_of(e.key):>15}  {e.key[:80]}")
    host = [e for e in prof.key_averages() if e.device_type.name == "CPU" and not e.key.startswith("ProfilerStep")]
    for e in sorted(host, key=lambda e: -e.self_cpu_time_total)[:host_top]:
        lines.append(f"  host {e.self_cpu_time_total / 1e3:8.2f} ms self {e.count:6d}x  {e.key[:80]}")
    return "\n".join(lines)
