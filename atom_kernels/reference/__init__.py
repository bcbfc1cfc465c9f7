"""Pure-torch reference ops: the CPU path and the oracle the Triton kernels are tested against."""

from atom_kernels.reference.activation import silu_and_mul
from atom_kernels.reference.attention import paged_attention
from atom_kernels.reference.fp8 import fp8_fused_moe, fp8_linear, fp8_quantize
from atom_kernels.reference.fused import fused_qk_norm_rope_write_kv
from atom_kernels.reference.fused_linear import (
    rms_norm_fp8_linear,
    rms_norm_linear,
    silu_and_mul_fp8_linear,
    silu_and_mul_linear,
)
from atom_kernels.reference.kv_cache import write_kv_cache
from atom_kernels.reference.linear import linear, pack_linear
from atom_kernels.reference.mla import mla_attention, mla_kv_indices, write_latent_cache
from atom_kernels.reference.moe import fused_moe
from atom_kernels.reference.norm import rms_norm
from atom_kernels.reference.rotary import rotary
from atom_kernels.reference.sampling import sample_tokens

__all__ = [
    "fp8_fused_moe", "fp8_linear", "fp8_quantize",
    "fused_moe", "fused_qk_norm_rope_write_kv", "linear", "mla_attention", "mla_kv_indices", "pack_linear",
    "paged_attention", "rms_norm", "rms_norm_fp8_linear", "rms_norm_linear",
    "rotary", "sample_tokens", "silu_and_mul", "silu_and_mul_fp8_linear", "silu_and_mul_linear", "write_kv_cache",
    "write_latent_cache",
]
