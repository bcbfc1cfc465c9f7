"""Where a GPU run's time goes: torch.profiler over one call, GPU kernels grouped by kind, the top kernels, and
the wall time next to the GPU time (a wall far above the GPU time with many launches means CPU-bound steps).

Shared by native_gpu.py and vllm_plugin_gpu.py (`--profile`). CUDA-graph replays count their kernels one by one.
trace_lines reads a chrome trace another process wrote (sglang_plugin_gpu.py --profile: SGLang's scheduler profiles
itself) and splits the decode graphs' kernels from the eager ones.
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


def kernel_lines(head: str, kernels: list[tuple[str, float, int]], top: int, per: int = 1) -> list[str]:
    """kernels: (name, total us, launches) → a head line with the GPU time, the time by kind and the top kernels;
    per > 1 divides times and counts by it (per step)."""
    gpu_us = sum(us for _, us, _ in kernels) / per
    by_kind: dict[str, list[float]] = {}
    for name, us, n in kernels:
        acc = by_kind.setdefault(kind_of(name), [0.0, 0])
        acc[0] += us / per
        acc[1] += n / per
    lines = [f"{head}, GPU kernels {gpu_us / 1e3:.3f} ms, {sum(n for _, _, n in kernels) / per:.0f} kernel launches"]
    lines.append("  by kind: " + ", ".join(
        f"{kind} {us / 1e3:.3f} ms ({us / max(gpu_us, 1):.0%}, {n:.0f}x)"
        for kind, (us, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0])))
    for name, us, n in sorted(kernels, key=lambda k: -k[1])[:top]:
        lines.append(f"  {us / per / 1e3:8.3f} ms {n / per:6.0f}x {kind_of(name):>15}  {name[:80]}")
    return lines


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
    kernels = [(e.key, e.self_device_time_total, e.count) for e in prof.key_averages()
               if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    lines = kernel_lines(f"{label}: wall {wall * 1e3:.1f} ms (profiler on)", kernels, top)
    host = [e for e in prof.key_averages() if e.device_type.name == "CPU" and not e.key.startswith("ProfilerStep")]
    for e in sorted(host, key=lambda e: -e.self_cpu_time_total)[:host_top]:
        lines.append(f"  host {e.self_cpu_time_total / 1e3:8.2f} ms self {e.count:6d}x  {e.key[:80]}")
    return "\n".join(lines)


def _union_us(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (us)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def trace_lines(path: str, label: str, top: int = 12, host_top: int = 12) -> list[str]:
    """A torch.profiler chrome trace (e.g. SGLang's start_profile/stop_profile in its scheduler process) → lines:
    the decode graph replays (kernels whose correlation id is a cudaGraphLaunch's), per replay: the host's period
    (median gap between launches), the graph's GPU time and its kernels; then the eager kernels in all; then the
    host's functions and ops by self time per replay (python_function events: with_stack traces). A period well
    above the graph's GPU time means the host sets the pace."""
    import gzip
    import json
    import statistics

    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    launches = sorted((e for e in events if e.get("cat") == "cuda_runtime"
                       and e.get("name", "").startswith("cudaGraphLaunch")), key=lambda e: e["ts"])
    graph_ids = {e.get("args", {}).get("correlation") for e in launches}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    split: dict[bool, dict[str, list[float]]] = {True: {}, False: {}}
    for e in gpu:
        acc = split[e.get("args", {}).get("correlation") in graph_ids].setdefault(e["name"], [0.0, 0])
        acc[0] += e["dur"]
        acc[1] += 1
    n = max(len(launches), 1)
    gaps = [b["ts"] - a["ts"] for a, b in zip(launches, launches[1:])]
    period = statistics.median(gaps) / 1e3 if gaps else float("nan")
    busy = _union_us([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    span = (max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)) if gpu else 0.0
    lines = [f"{label}: {len(launches)} decode graph replays, host period {period:.3f} ms (median; x replays = "
             f"{period * len(launches):.1f} ms); the GPU busy {busy / max(span, 1):.0%} of the trace's "
             f"{span / 1e3:.1f} ms (the rest of the span: prefill and start-up)"]
    lines += kernel_lines("  per replay", [(k, us, c) for k, (us, c) in split[True].items()], top, per=n)
    eager = [(k, us, c) for k, (us, c) in split[False].items()]
    lines += kernel_lines("  eager (prefill, sampling, metadata; all of them)", eager, min(top, 6))
    for name, us in _host_self_times(events, launches)[:host_top]:
        lines.append(f"  host {us / n / 1e3:8.3f} ms/replay self  {name[:90]}")
    return lines


def _host_self_times(events: list[dict], launches: list[dict]) -> list[tuple[str, float]]:
    """Self time (us) of each Python function and op on the thread that launches the graphs (else the busiest
    thread): an event's duration less its direct children's (a thread's events nest), largest first."""
    host = [e for e in events if e.get("cat") in ("python_function", "cpu_op", "cuda_runtime")]
    if not host:
        return []
    counts: dict = {}
    for e in launches or host:
        counts[e.get("tid")] = counts.get(e.get("tid"), 0) + 1
    tid = max(counts, key=counts.get)
    self_us: dict[str, float] = {}
    stack: list[dict] = []  # open events, outermost first
    for e in sorted((e for e in host if e.get("tid") == tid), key=lambda e: (e["ts"], -e["dur"])):
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        if stack:
            self_us[stack[-1]["name"]] = self_us.get(stack[-1]["name"], 0.0) - e["dur"]
        self_us[e["name"]] = self_us.get(e["name"], 0.0) + e["dur"]
        stack.append(e)
    return sorted(self_us.items(), key=lambda kv: -kv[1])
