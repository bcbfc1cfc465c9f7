"""Building blocks of atom-core models."""

from atom_core.layers.activation import check_gated_act
from atom_core.layers.attention import Attention, AttentionSpec, attention_forward
from atom_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from atom_core.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from atom_core.layers.norm import RMSNorm
from atom_core.layers.rotary import RotaryEmbedding, get_rope

__all__ = [
    "Attention", "AttentionSpec", "attention_forward", "ColumnParallelLinear", "MergedColumnParallelLinear",
    "ParallelLMHead", "QKVParallelLinear", "ReplicatedLinear", "RMSNorm", "RotaryEmbedding",
    "RowParallelLinear", "VocabParallelEmbedding", "check_gated_act", "get_rope",
]
