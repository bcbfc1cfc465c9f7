"""DeepSeek-V2 / V3: the Llama decoder with MLA attention (atom_core.layers.mla) and MoE layers (routed experts +
shared experts) after the first `first_k_dense_replace` dense layers.

Routers are data (moe_router.router_config): V2 softmax + greedy / group_limited_greedy, V3 sigmoid + noaux_tc
with its correction bias. Multi-token-prediction (MTP) layers, which DeepSeek-V3 checkpoints store as
`model.layers.{num_hidden_layers + i}.*`, are skipped when loading: they only serve speculative decoding.
n_shared_experts 0 (or None) means no shared experts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from atom_core.config import AtomConfig
from atom_core.layers.mla import MLAAttention
from atom_core.layers.moe import MoE
from atom_core.layers.moe_router import router_config
from atom_core.models.llama import LlamaForCausalLM, LlamaMLP

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def is_moe_layer(cfg, layer_idx: int) -> bool:
    """DeepSeek's rule (and vLLM's); transformers' equals it for moe_layer_freq 1, the only value it knows."""
    return (bool(getattr(cfg, "n_routed_experts", None)) and layer_idx >= cfg.first_k_dense_replace
            and layer_idx % (getattr(cfg, "moe_layer_freq", 1) or 1) == 0)


def deepseek_mlp(config: AtomConfig, layer_idx: int) -> nn.Module:
    cfg = config.hf_config
    if not is_moe_layer(cfg, layer_idx):
        return LlamaMLP(cfg)
    shared = LlamaMLP(cfg, cfg.moe_intermediate_size * cfg.n_shared_experts) if cfg.n_shared_experts else None
    return MoE(cfg.hidden_size, cfg.moe_intermediate_size, router_config(cfg), cfg.hidden_act, shared)


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    build_mlp = staticmethod(deepseek_mlp)
    attention_cls = MLAAttention

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        num_layers = self.config.hf_config.num_hidden_layers

        def main_model(name: str) -> bool:  # False for the MTP layers past the decoder's last layer
            layer = _LAYER.match(name)
            return layer is None or int(layer[1]) < num_layers

        # Empty tensors carry no weights: with n_shared_experts=0, transformers (and DeepSeek's own code) build
        # 0-wide shared experts and save their empty weights, where we build none.
        return super().load_weights((name, t) for name, t in weights if main_model(name) and t.numel())


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    pass
