"""How much memory the native engine's KV cache gets by default, measured once the weights are loaded."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

GIB = 1 << 30
GPU_KV_CACHE_FRACTION = 0.85  # of the GPU memory still free once the weights are loaded
CPU_KV_CACHE_FRACTION = 0.5  # of MemAvailable once the weights are loaded (activations, the OS, others need room)
CPU_KV_CACHE_MAX = 4 * GIB  # as vLLM's CPU default (VLLM_CPU_KVCACHE_SPACE=4): a big machine is not emptied


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):  # absent, or "max" (no limit)
        return None


def _cgroup_room(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this container's memory cgroup still allows (limit - usage; v2, else v1), None without a limit.
    A container sees the host's MemAvailable, not its own limit."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit, usage = _read_int(root / limit_file), _read_int(root / usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:  # v1 writes ~2**63 for "no limit"
            return max(limit - usage, 0)
    return None


def _mem_available() -> int | None:
    """Bytes of memory free for us: Linux's MemAvailable (free plus what the kernel can reclaim), capped by
    the memory cgroup's remaining room; None where neither can be read."""
    meminfo = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    meminfo = int(line.split()[1]) * 1024
    except OSError:
        pass
    known = [n for n in (meminfo, _cgroup_room()) if n is not None]
    return min(known) if known else None


def default_kv_cache_bytes(device: torch.device, most: int) -> tuple[int, str]:
    """(KV cache budget in bytes, what set it), measured now, i.e. after the weights are loaded. `most`: the
    bytes of max_num_seqs sequences of max_model_len tokens, more than a CPU cache ever uses at once."""
    if device.type == "cuda":
        # Memory torch still caches for dead tensors (an earlier engine's KV cache, say) goes back to the driver
        # first: counted as free but left cached, its segments need not fit this cache's tensors (out of memory).
        gc.collect()
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * GPU_KV_CACHE_FRACTION), f"{GPU_KV_CACHE_FRACTION:.0%} of free GPU memory"
    bounds = [(CPU_KV_CACHE_MAX, f"the CPU default of at most {format_size(CPU_KV_CACHE_MAX)}"),
              (most, "room for max_num_seqs sequences of max_model_len")]
    available = _mem_available()
    if available is not None:
        bounds.append((int(available * CPU_KV_CACHE_FRACTION), f"{CPU_KV_CACHE_FRACTION:.0%} of available memory"))
    return min(bounds)


def format_size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"
