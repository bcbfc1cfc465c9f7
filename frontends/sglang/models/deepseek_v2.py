"""SGLang EntryClass `DeepseekV2ForCausalLM`: atom-core's DeepSeek-V2 model (MLA over SGLang's MLA token pool)."""

from atom_frontends.sglang.wrapper import entry_class

EntryClass = entry_class("DeepseekV2ForCausalLM", __name__)
