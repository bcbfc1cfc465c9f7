"""AttentionSpec: what the Attention factory tells a host about one attention layer (MHA or MLA).

Its own module, importing nothing of atom_core, so that the hook specifications can name it without an import
cycle (hookspecs -> layers.attention -> plugins -> hookspecs).
"""

from __future__ import annotations

from dataclasses import dataclass

# The atom_kernels ops each kind of attention runs: hosts check that a device has kernels for them.
FULL_ATTENTION_OPS = ("write_kv_cache", "paged_attention")
MLA_OPS = ("write_latent_cache", "mla_attention")


@dataclass(frozen=True)
class AttentionSpec:
    num_heads: int  # query heads on this rank
    head_dim: int
    scale: float
    num_kv_heads: int  # KV heads on this rank
    prefix: str  # layer name, e.g. "model.layers.3.self_attn.attn"
    sliding_window: int | None = None  # None or <= 0: full attention
    kv_cache_dtype: str = "auto"
    # MLA (latent cache) fields; unused by full-attention layers.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None

    @property
    def uses_sliding_window(self) -> bool:
        return self.sliding_window is not None and self.sliding_window > 0

    @property
    def kernel_ops(self) -> tuple[str, ...]:
        """The atom_kernels ops a layer of this spec runs (its KV write and its attention)."""
        return MLA_OPS if self.is_mla else FULL_ATTENTION_OPS

    @property
    def is_mla(self) -> bool:
        """A latent-cache (MLA) layer: one KV "head" of head_dim = kv_lora_rank + qk_rope_head_dim per token."""
        return self.kv_lora_rank is not None
