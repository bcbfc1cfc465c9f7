"""The SGLang host's attention layer (answer of `atom_attention_impl`): a RadixAttention.

Being SGLang's own layer type, it runs under whichever `--attention-backend` SGLang was started
with: atom-core's ("atom", backend.py), or SGLang's (e.g. torch_native). It takes the current
ForwardBatch from the runtime bridge, since atom-core's model code never passes host objects.
Imported only when SGLang drives the process (it imports sglang).
"""

from __future__ import annotations

import torch
from sglang.srt.layers.radix_attention import RadixAttention

from atom_core.layers.attention import AttentionSpec
from atom_frontends.sglang.adapters import layer_id_from_prefix
from atom_frontends.sglang.bridge import current_forward_batch


class SGLangAttention(RadixAttention):
    def __init__(self, spec: AttentionSpec) -> None:
        if spec.kv_lora_rank is not None:
            raise NotImplementedError(f"{spec.prefix}: MLA (latent KV cache) layers are not supported by "
                                      "atom-core's SGLang frontend yet")
        # SGLang's sliding_window_size counts the keys before the query; ours counts the query too.
        window = spec.sliding_window - 1 if spec.uses_sliding_window else -1
        super().__init__(spec.num_heads, spec.head_dim, spec.scale, spec.num_kv_heads,
                         layer_id=layer_id_from_prefix(spec.prefix), sliding_window_size=window,
                         prefix=spec.prefix)
        self.spec = spec

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """query [T, heads*d], key/value [T, kv_heads*d] → [T, heads*d]"""
        return super().forward(query, key, value, current_forward_batch())
