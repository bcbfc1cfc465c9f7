"""SGLang EntryClass `LlamaForCausalLM`: atom-core's Llama model."""

from atom_frontends.sglang.wrapper import entry_class

EntryClass = entry_class("LlamaForCausalLM", __name__)
