"""A linear layer with its input op in front: RMSNorm (+ residual add) → linear, SiLU-and-mul → linear, for model-dtype
and for fp8 weights (fp8_linear).

The reference is the two ops, each as the dispatcher runs it on the input's device (so a host's own GEMM, e.g.
vLLM's prepacked CPU one, still serves the linear); a device kernel may fuse them (Triton: the norm or the
activation as a one-row GEMV's prologue).
"""

from __future__ import annotations

import atom_kernels


def rms_norm_linear(x, residual, norm_weight, eps: float, weight, bias=None, packed=None):
    """x [..., K] (+ residual [..., K]) → (linear(rms_norm(x + residual)) [..., N], x + residual); residual None:
    (linear(rms_norm(x)), x)."""
    if residual is None:
        h, residual = atom_kernels.rms_norm(x, norm_weight, eps), x
    else:
        h, residual = atom_kernels.rms_norm(x, norm_weight, eps, residual)
    return atom_kernels.linear(h, weight, bias, packed), residual


def silu_and_mul_linear(x, weight, bias=None, packed=None):
    """x [..., 2K] (gate | up) → linear(silu(gate) * up) [..., N]."""
    return atom_kernels.linear(atom_kernels.silu_and_mul(x), weight, bias, packed)


def rms_norm_fp8_linear(x, residual, norm_weight, eps: float, weight, weight_scale, block_k: int, act_group: int,
                        input_scale=None, bias=None, block_n: int = 0):
    """rms_norm_linear with fp8_linear's weight: (fp8_linear(rms_norm(x + residual), ...), x + residual)."""
    if residual is None:
        h, residual = atom_kernels.rms_norm(x, norm_weight, eps), x
    else:
        h, residual = atom_kernels.rms_norm(x, norm_weight, eps, residual)
    return atom_kernels.fp8_linear(h, weight, weight_scale, block_k, act_group, input_scale, bias, block_n), residual


def silu_and_mul_fp8_linear(x, weight, weight_scale, block_k: int, act_group: int, input_scale=None, bias=None,
                            block_n: int = 0):
    """silu_and_mul_linear with fp8_linear's weight."""
    return atom_kernels.fp8_linear(atom_kernels.silu_and_mul(x), weight, weight_scale, block_k, act_group,
                                   input_scale, bias, block_n)
