"""SGLang EntryClass `Qwen3ForCausalLM`: atom-core's Qwen3 model."""

from atom_frontends.sglang.wrapper import entry_class

EntryClass = entry_class("Qwen3ForCausalLM", __name__)
