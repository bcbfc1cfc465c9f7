"""The native engine's CPU GEMM: torch's oneDNN matmul over float32 weights prepacked once after loading.

On CPU, F.linear in float32 runs MKL's sgemm; oneDNN with the weight reordered once into its blocked format is
faster at every row count a step has (measured: docs/kernels/linear.md). Both are plain float32 GEMMs: they
differ in the order of the sums only,
as MKL's own kernels for different shapes do, and as vLLM's prepacked CPU GEMM (atom_frontends.vllm.cpu_linear)
does. The native engine makes these two functions the dispatcher's "host" kernels of pack_linear and linear on
CPU (cpu_kernels.register_host_kernels, like the vLLM frontend with vLLM's GEMM); ATOM_KERNEL_BACKEND=torch runs
the reference (F.linear) instead. Other dtypes keep F.linear (torch already sends bf16 to oneDNN).

Layers keep their weight next to the packed copy: the tied LM head shares it with the embedding, and the
reference needs it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

HOST_KERNELS = {"pack_linear": f"{__name__}:pack_linear", "linear": f"{__name__}:linear"}


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """weight [out, in] → the same weight in oneDNN's blocked format (an opaque mkldnn tensor), or None where
    F.linear serves (not float32, or no oneDNN in this torch build)."""
    if weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           packed: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] → [..., out] with pack_linear's weight; F.linear for a weight that was never packed."""
    if packed is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
