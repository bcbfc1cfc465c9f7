"""HF `architectures` name → atom-core model class."""

from __future__ import annotations

import importlib

_MODELS: dict[str, str] = {
    "DeepseekV2ForCausalLM": "atom_core.models.deepseek:DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "atom_core.models.deepseek:DeepseekV3ForCausalLM",
    "LlamaForCausalLM": "atom_core.models.llama:LlamaForCausalLM",
    "Qwen3ForCausalLM": "atom_core.models.qwen3:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "atom_core.models.qwen3_moe:Qwen3MoeForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def is_supported(arch: str) -> bool:
    return arch in _MODELS


def register_model(arch: str, target: str) -> None:
    """Add an architecture: `target` is "module:Class" (imported lazily)."""
    _MODELS[arch] = target


def get_model_class(arch: str) -> type:
    if arch not in _MODELS:
        raise ValueError(f"architecture {arch!r} is not supported by atom-core; "
                         f"supported: {', '.join(supported_architectures())}")
    module, name = _MODELS[arch].split(":")
    return getattr(importlib.import_module(module), name)
