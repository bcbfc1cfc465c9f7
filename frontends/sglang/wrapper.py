"""The model class SGLang instantiates for an atom-core architecture (EntryClass of our model package).

SGLang's contract: `__init__(config, quant_config=None, prefix="")` inside its loader (model dtype
as torch's default dtype, target device as the default device), `load_weights(weights)`, and
`forward(input_ids, positions, forward_batch, ...)` returning a LogitsProcessorOutput. The core
builds the model from SGLang's own config objects (atom_core.loader.build_model, which asks our
`atom_translate_config` for the AtomConfig).
This module imports SGLang only inside methods: SGLang imports our model package while its model
registry is still initialising.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
from torch import nn

from atom_core.dummy_weights import init_dummy_weights
from atom_core.layers.kernel_warmup import warm_up
from atom_core.loader import build_model, prepare_weights, require_all_loaded
from atom_frontends.sglang.bridge import forward_batch_context
from atom_frontends.sglang.config import SGLangModelConfig
from atom_frontends.sglang.hooks import SGLANG


def _lm_head_layout() -> contextlib.AbstractContextManager:
    """Where SGLang's LogitsProcessor (built inside) gathers the logits from. Under DP attention our LM head is whole
    on each rank (attention-TP size 1: data_parallel.py) over the rank's own tokens: SGLang's --enable-dp-lm-head
    layout, whether or not the flag was given. Without DP attention: the TP group, as SGLang reads its flags."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if parallel.attn_dp_size == 1 or parallel.enable_dp_lm_head:
        return contextlib.nullcontext()
    return parallel.override(enable_dp_lm_head=True)


class AtomSGLangModel(nn.Module):
    """Base of every EntryClass: a subclass per architecture, named for it (entry_class)."""

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__()
        from sglang.srt.layers.logits_processor import LogitsProcessor

        host_config = SGLangModelConfig.from_model_init(config, quant_config, prefix)
        with SGLANG.scope():
            self.core, self.atom_config, _ = build_model(host_config, architecture=type(self).__name__)
        self._check_layer_ids()
        self.config = config
        self.quant_config = quant_config
        with _lm_head_layout():
            self.logits_processor = LogitsProcessor(config)
        self._weights_loaded = False
        # --load-format dummy: the seed our random weights are drawn with once SGLang's dummy loader has filled the
        # parameters (post_load_weights); None once drawn, and for every other load format
        args = host_config.server_args
        self._dummy_seed = (getattr(args, "random_seed", None) or 0) if getattr(args, "load_format", None) == "dummy" \
            else None

    def _check_layer_ids(self) -> None:
        """Each attention layer's id in SGLang's KV pool (from its prefix) is unique and in range."""
        from sglang.srt.layers.radix_attention import RadixAttention

        ids = sorted(m.layer_id for m in self.core.modules() if isinstance(m, RadixAttention))
        num_layers = self.atom_config.hf_config.num_hidden_layers
        if len(set(ids)) != len(ids) or (ids and not 0 <= ids[0] <= ids[-1] < num_layers):
            raise ValueError(f"{type(self).__name__}: attention layer ids {ids} are not unique ids "
                             f"within [0, num_hidden_layers={num_layers}) of SGLang's KV pool")

    def get_input_embeddings(self) -> nn.Module:
        return self.core.model.embed_tokens

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
            self.post_load_weights()
        return loaded

    def post_load_weights(self) -> None:
        """Once the first full set of weights is in: load_weights calls it, and SGLang's loaders that bypass
        load_weights call it themselves (--load-format dummy: random weights from config.json alone).

        Under --load-format dummy the weights are first drawn again by atom_core.dummy_weights, as the native engine
        and the vLLM plugin draw them: SGLang's dummy loader draws every tensor uniform in [-1e-3, 1e-3] and sets
        only scales named weight_scale_inv to 1 (ours are weight_scale), so e4m3 weights round to zero and our
        scales take either sign: the fp8 layers would compute next to nothing."""
        if self._dummy_seed is not None:
            init_dummy_weights(self.core, self._dummy_seed)
            self._dummy_seed = None
        prepare_weights(self.core)  # e.g. an fp8 MLA kv_b_proj dequantized, CPU GEMMs prepacked
        self._weights_loaded = True
        self._warm_up_moe()

    def get_weights_by_name(self, name: str, truncate_size: int = 100, tp_size: int = 1) -> list[float]:
        """SGLang's Engine.get_weights_by_name (its tests' and RL frameworks' check of what a rank holds): this rank's
        parameter `name` as this model names it (its named_parameters(): `core.` + atom-core's names, fused layers
        as fused, e.g. core.model.layers.0.self_attn.qkv_proj.weight), flattened, its first truncate_size values as
        float32. tp_size: SGLang passes it; a rank's parameters are its shards already."""
        params = dict(self.named_parameters())
        if name not in params:
            raise KeyError(f"{name!r} is not a parameter of this atom-core model; its names are named_parameters()'s, "
                           f"e.g. {next(iter(params))!r}")
        return params[name].detach().flatten()[:truncate_size].float().cpu().tolist()

    def _warm_up_moe(self) -> None:
        """kernel_warmup's warm-up of the MoE layers, once the weights are in: SGLang's loader runs this at start-up,
        outside any graph capture, whatever the attention backend; SGLang then reads free memory after emptying
        torch's cache, so the warm-up's activations do not shrink the KV pool it sizes next. A step's tokens: at most
        an extend's budget, or one per running request in a decode (max_num_seqs: --max-running-requests, else
        256)."""
        c = self.atom_config
        warm_up(c.dtype, c.max_model_len, max(c.max_num_batched_tokens, c.max_num_seqs), model=self.core)


def entry_class(architecture: str) -> type:
    """An EntryClass for SGLang's model registry: a subclass whose __name__ IS the HF architecture."""
    return type(architecture, (AtomSGLangModel,),
                {"__module__": "atom_frontends.sglang.models.entry", "__qualname__": architecture})
