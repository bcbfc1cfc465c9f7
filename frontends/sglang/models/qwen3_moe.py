"""SGLang EntryClass `Qwen3MoeForCausalLM`: atom-core's Qwen3-MoE model."""

from atom_frontends.sglang.wrapper import entry_class

EntryClass = entry_class("Qwen3MoeForCausalLM", __name__)
