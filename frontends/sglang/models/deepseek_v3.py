"""SGLang EntryClass `DeepseekV3ForCausalLM`: atom-core's DeepSeek-V3 model (MLA over SGLang's MLA token pool)."""

from atom_frontends.sglang.wrapper import entry_class

EntryClass = entry_class("DeepseekV3ForCausalLM", __name__)
