"""Model adapter registry: HF architecture → what the SGLang wrapper needs to know about a family.

Declarative on purpose: the wrapper holds no per-model `if`. A family that needs something
special adds a hook to its spec (config preparation, KV-pool layer numbering, setup after loading);
every hook has a default that suits plain decoder stacks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_id_from_prefix(prefix: str) -> int:
    """'model.layers.3.self_attn.attn' → 3: the layer's index in SGLang's KV pool."""
    match = _LAYER_RE.search(prefix)
    if match is None:
        raise ValueError(f"cannot tell the decoder layer index of attention layer {prefix!r}: expected "
                         "'...layers.<i>....'; give the model's adapter its own layer_id hook")
    return int(match.group(1))


def _keep_config(hf_config: Any) -> Any:
    return hf_config


def _no_setup(model: nn.Module) -> None:
    return None


def _decoder_embeddings(model: nn.Module) -> nn.Module:
    return model.model.embed_tokens


@dataclass(frozen=True)
class ModelAdapter:
    architecture: str  # the HF `architectures[0]` that SGLang resolves to our EntryClass
    core_architecture: str  # the atom_core.models registry name of the model we build
    # SGLang's hf_config → the config the core model is built from (may return a modified copy)
    prepare_config: Callable[[Any], Any] = _keep_config
    # attention layer prefix → layer id in SGLang's KV pool
    layer_id: Callable[[str], int] = layer_id_from_prefix
    # run once on the core model after SGLang loaded its weights
    post_load: Callable[[nn.Module], None] = _no_setup
    # core model → its token embedding module (SGLang's get_input_embeddings)
    input_embeddings: Callable[[nn.Module], nn.Module] = _decoder_embeddings


_ADAPTERS: dict[str, ModelAdapter] = {}


def register_adapter(adapter: ModelAdapter) -> None:
    _ADAPTERS[adapter.architecture] = adapter


def get_adapter(architecture: str) -> ModelAdapter:
    if architecture not in _ADAPTERS:
        raise ValueError(f"atom-core's SGLang frontend has no adapter for {architecture!r}; "
                         f"known: {', '.join(sorted(_ADAPTERS))}")
    return _ADAPTERS[architecture]


def adapted_architectures() -> list[str]:
    return sorted(_ADAPTERS)


# Llama, Qwen3, Qwen3-MoE and DeepSeek-V2/V3 are plain decoder stacks ('model.layers.<i>.self_attn.attn'): the
# defaults fit. SGLang gives the DeepSeek architectures its MLA token pool (by architecture name).
register_adapter(ModelAdapter("LlamaForCausalLM", "LlamaForCausalLM"))
register_adapter(ModelAdapter("Qwen3ForCausalLM", "Qwen3ForCausalLM"))
register_adapter(ModelAdapter("Qwen3MoeForCausalLM", "Qwen3MoeForCausalLM"))
register_adapter(ModelAdapter("DeepseekV2ForCausalLM", "DeepseekV2ForCausalLM"))
register_adapter(ModelAdapter("DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM"))
