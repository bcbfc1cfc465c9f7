"""The SGLang host's attention layer (answer of `atom_attention_impl`): a RadixAttention.

Being SGLang's own layer type, it runs under whichever `--attention-backend` SGLang was started
with: atom-core's ("atom", backend.py), or SGLang's (e.g. torch_native). It takes the current
ForwardBatch from the runtime bridge, since atom-core's model code never passes host objects.
An MLA spec gets SGLangMLAAttention: SGLang's MLA form of the layer (one KV "head" of r + rope, values r
wide) over the MLA token pool that SGLang picks for DeepSeek architectures.
Imported only when SGLang drives the process (it imports sglang).
"""

from __future__ import annotations

import re

import torch
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.model_executor.forward_context import get_attn_backend, has_forward_context

from atom_core.layers.attention import AttentionSpec
from atom_frontends.sglang.backend import AtomAttnBackend
from atom_frontends.sglang.bridge import current_forward_batch

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_id_from_prefix(prefix: str) -> int:
    """'model.layers.3.self_attn.attn' → 3: the layer's index in SGLang's KV pool."""
    match = _LAYER_RE.search(prefix)
    if match is None:
        raise ValueError(f"cannot tell the decoder layer index of attention layer {prefix!r}: atom-core's SGLang "
                         "frontend expects a decoder stack's '...layers.<i>....' prefix")
    return int(match.group(1))


class SGLangAttention(RadixAttention):
    # Qwen3's q/k norm + rotary fused into atom-core's K/V write, on decode steps under the atom backend
    # (forward_qk_norm_rope); the model runs the unfused form on every other step.
    fuses_qk_norm_rope = True

    def __init__(self, spec: AttentionSpec) -> None:
        if spec.is_mla:
            raise TypeError(f"{spec.prefix}: an MLA spec builds SGLangMLAAttention, not SGLangAttention")
        # SGLang's sliding_window_size counts the keys before the query; ours counts the query too.
        window = spec.sliding_window - 1 if spec.uses_sliding_window else -1
        super().__init__(spec.num_heads, spec.head_dim, spec.scale, spec.num_kv_heads,
                         layer_id=layer_id_from_prefix(spec.prefix), sliding_window_size=window,
                         prefix=spec.prefix)
        self.spec = spec

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """query [T, heads*d], key/value [T, kv_heads*d] → [T, heads*d]"""
        return super().forward(query, key, value, current_forward_batch())

    def forward_qk_norm_rope(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, norm_rope: tuple) -> torch.Tensor | None:
        """Qwen3's q/k norm + rotary fused with the K/V write, then attention, on a DECODE step run by atom-core's
        backend (backend.py): query [T, heads, d], key/value [T, kv_heads, d] (strided rows) → [T, heads*d].
        None on any other step, under another backend and inside torch.compile: there the model runs the unfused
        prologue and RadixAttention.forward, which carries SGLang's handling of prefill graphs, padded extends and
        compiled regions (a decode step has none of these)."""
        if torch.compiler.is_compiling() or not has_forward_context():
            return None
        backend = get_attn_backend()
        if not isinstance(backend, AtomAttnBackend) or not current_forward_batch().forward_mode.is_decode():
            return None
        return backend.forward_qk_norm_rope(self, positions, query, key, value, norm_rope)


class SGLangMLAAttention(SGLangAttention):
    """MLA in the absorbed form: RadixAttention with qk_head_dim = r + rope, one KV head, v_head_dim = r."""

    fuses_qk_norm_rope = False  # a latent cache has no per-head K to norm

    def __init__(self, spec: AttentionSpec) -> None:
        if not spec.is_mla:
            raise TypeError(f"{spec.prefix}: SGLangMLAAttention needs an MLA spec (kv_lora_rank set)")
        RadixAttention.__init__(self, spec.num_heads, spec.head_dim, spec.scale, 1,
                                layer_id=layer_id_from_prefix(spec.prefix), v_head_dim=spec.kv_lora_rank,
                                prefix=spec.prefix)
        self.spec = spec

    def forward(self, query: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """query [T, heads, r + rope], latent [T, r + rope] → [T, heads, r]. SGLang's MLA calling convention:
        k [T, 1, r + rope] is the row to write, v [T, 1, r] a view of its first r features."""
        t, r = query.shape[0], self.spec.kv_lora_rank
        k = latent.view(t, 1, self.spec.head_dim)
        out = RadixAttention.forward(self, query, k, k[..., :r], current_forward_batch())
        return out.view(t, self.spec.num_heads, r)
