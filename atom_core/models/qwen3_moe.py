"""Qwen3-MoE: the Qwen3 decoder whose MLPs are MoE layers (softmax top-k router, no shared experts), except
the dense layers the config names: those in `mlp_only_layers`, and all but every `decoder_sparse_step`-th."""

from __future__ import annotations

from torch import nn

from atom_core.config import AtomConfig
from atom_core.layers.moe import MoE
from atom_core.layers.moe_router import router_config
from atom_core.models.llama import LlamaMLP
from atom_core.models.qwen3 import Qwen3ForCausalLM


def is_moe_layer(cfg, layer_idx: int) -> bool:
    """transformers' Qwen3MoeDecoderLayer rule."""
    step = getattr(cfg, "decoder_sparse_step", 1) or 1
    return (layer_idx not in (getattr(cfg, "mlp_only_layers", None) or [])
            and cfg.num_experts > 0 and (layer_idx + 1) % step == 0)


def qwen3_moe_mlp(config: AtomConfig, layer_idx: int) -> nn.Module:
    cfg = config.hf_config
    if not is_moe_layer(cfg, layer_idx):
        return LlamaMLP(cfg)
    return MoE(cfg.hidden_size, cfg.moe_intermediate_size, router_config(cfg), cfg.hidden_act)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    build_mlp = staticmethod(qwen3_moe_mlp)
