"""The gated MLP activation: SiLU-and-mul (atom_kernels.silu_and_mul, or fused into the down projection's GEMM:
RowParallelLinear.forward_silu_and_mul)."""

from __future__ import annotations


def check_gated_act(name: str) -> None:
    """Raise for a hidden_act the gated MLP does not implement."""
    if name not in ("silu", "swish"):
        raise ValueError(f"hidden_act={name!r} is not supported; supported: silu")
