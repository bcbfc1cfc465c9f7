"""The model class SGLang instantiates for an atom-core architecture (EntryClass of our model package).

SGLang's contract: `__init__(config, quant_config=None, prefix="")` inside its loader (model dtype
as torch's default dtype, target device as the default device), `load_weights(weights)`, and
`forward(input_ids, positions, forward_batch, ...)` returning a LogitsProcessorOutput. The core
model is built from an AtomConfig that `atom_translate_config` makes of SGLang's own config objects.
This module imports SGLang only inside methods: SGLang imports our model package while its model
registry is still initialising.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from atom_core.layers.kernel_warmup import warm_up
from atom_core.loader import build_model, require_all_loaded
from atom_core.plugins import current_platform, translate_config
from atom_frontends.sglang.adapters import ModelAdapter, get_adapter
from atom_frontends.sglang.bridge import forward_batch_context
from atom_frontends.sglang.config import SGLangModelConfig
from atom_frontends.sglang.hooks import HOST, SGLANG


class AtomSGLangModel(nn.Module):
    """Base of every EntryClass; `adapter` (a ModelAdapter) is set per architecture."""

    adapter: ModelAdapter

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__()
        from sglang.srt.layers.logits_processor import LogitsProcessor

        hf_config = self.adapter.prepare_config(config)
        host_config = SGLangModelConfig.from_model_init(hf_config, quant_config, prefix)
        with SGLANG.scope():
            self.atom_config = translate_config(host_config, host=HOST)
            platform = current_platform(HOST)
            self.core = build_model(self.atom_config, platform.device, self.adapter.core_architecture)
        self._bind_layer_ids()
        self.config = config
        self.quant_config = quant_config
        self.logits_processor = LogitsProcessor(config)
        self._weights_loaded = False

    def _bind_layer_ids(self) -> None:
        """Each attention layer's id in SGLang's KV pool, from the adapter; unique and in range."""
        from atom_frontends.sglang.attention import SGLangAttention

        layers = [m for m in self.core.modules() if isinstance(m, SGLangAttention)]
        for layer in layers:
            layer.layer_id = self.adapter.layer_id(layer.spec.prefix)
        ids = sorted(layer.layer_id for layer in layers)
        num_layers = self.atom_config.hf_config.num_hidden_layers
        if len(set(ids)) != len(ids) or (ids and not 0 <= ids[0] <= ids[-1] < num_layers):
            raise ValueError(f"{self.adapter.architecture}: attention layer ids {ids} are not unique ids "
                             f"within [0, num_hidden_layers={num_layers}) of SGLang's KV pool; fix the "
                             "adapter's layer_id")

    def get_input_embeddings(self) -> nn.Module:
        return self.adapter.input_embeddings(self.core)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: torch.Tensor | None = None, get_embedding: bool = False, **kwargs):
        """input_ids, positions: [T] → sglang LogitsProcessorOutput (logits of the sampled rows)."""
        if get_embedding:
            raise NotImplementedError("atom-core's SGLang models are generation models; embedding/pooling "
                                      "(--is-embedding) is not supported")
        if kwargs.get("pp_proxy_tensors") is not None:
            raise NotImplementedError("pipeline parallelism is not supported by atom-core's SGLang models")
        if input_embeds is not None:
            input_embeds = input_embeds.to(self.atom_config.dtype)
        with forward_batch_context(forward_batch):
            hidden = self.core(input_ids, positions, input_embeds)  # [T, hidden_size]
        return self.logits_processor(input_ids, hidden, self.core.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint (name, tensor) pairs → the core model. The first (full) load must cover every
        parameter; later calls (SGLang's weight updates) may carry a subset."""
        loaded = self.core.load_weights(weights)
        if not self._weights_loaded:
            require_all_loaded(self.core, loaded, self.atom_config.model_path)
            self._weights_loaded = True
            self.adapter.post_load(self.core)
            self._warm_up_moe()
        return loaded

    def _warm_up_moe(self) -> None:
        """kernel_warmup's warm-up of the MoE layers, once the weights are in: SGLang's loader runs this at start-up,
        outside any graph capture, whatever the attention backend; SGLang then reads free memory after emptying
        torch's cache, so the warm-up's activations do not shrink the KV pool it sizes next. A step's tokens: at most
        an extend's budget, or one per running request in a decode (max_num_seqs: --max-running-requests, else
        256)."""
        c = self.atom_config
        warm_up(c.dtype, c.max_model_len, max(c.max_num_batched_tokens, c.max_num_seqs), model=self.core)


def entry_class(architecture: str, module: str) -> type:
    """An EntryClass for SGLang's model registry: a subclass whose __name__ IS the HF architecture."""
    return type(architecture, (AtomSGLangModel,),
                {"adapter": get_adapter(architecture), "__module__": module, "__qualname__": architecture})
