"""Runs one scheduled step: builds inputs + metadata, runs the model, samples."""

from __future__ import annotations

import torch

from atom_core.config import AtomConfig
from atom_core.forward_context import set_forward_context
from atom_core.platform import Platform
from atom_core.plugins import metadata_builder
from atom_frontends.native.attention import NativeAttention
from atom_frontends.native.metadata import SeqChunk
from atom_frontends.native.sampler import sample
from atom_frontends.native.scheduler import Scheduled

FP8_KV = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}


class ModelRunner:
    def __init__(self, model: torch.nn.Module, config: AtomConfig, platform: Platform, seed: int) -> None:
        self.model, self.config, self.device = model, config, platform.device
        self.attn_layers = [m for m in model.modules() if isinstance(m, NativeAttention)]
        self.build_metadata = metadata_builder(spec=None, host="native")
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.num_blocks = 0

    @property
    def kv_dtype(self) -> torch.dtype:
        return FP8_KV.get(self.config.kv_cache_dtype, self.config.dtype)

    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.kv_dtype).element_size()
        per_layer = sum(2 * a.spec.num_kv_heads * a.spec.head_dim for a in self.attn_layers)
        return per_layer * self.config.block_size * elem

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """One [2, num_blocks, block_size, kv_heads, head_dim] tensor per attention layer."""
        self.num_blocks = num_blocks
        for layer in self.attn_layers:
            s = layer.spec
            layer.kv_cache = torch.zeros(2, num_blocks, self.config.block_size, s.num_kv_heads, s.head_dim,
                                         dtype=self.kv_dtype, device=self.device)
            if self.config.kv_cache_dtype != "auto":
                layer.k_scale = torch.ones((), dtype=torch.float32, device=self.device)
                layer.v_scale = torch.ones((), dtype=torch.float32, device=self.device)

    @torch.inference_mode()
    def execute(self, batch: list[Scheduled]) -> list[int | None]:
        """Returns the sampled token of each scheduled request that completed, None for partial chunks."""
        chunks, input_ids = [], []
        for s in batch:
            r = s.request
            start = r.num_computed_tokens
            chunks.append(SeqChunk(r.block_ids, start, s.num_new_tokens))
            input_ids.extend(r.all_token_ids[start : start + s.num_new_tokens])
        md = self.build_metadata(chunks, self.config.block_size, self.device)
        ids = torch.tensor(input_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        with set_forward_context(md):
            hidden = self.model(ids, md.positions)
        rows = [i for i, s in enumerate(batch) if s.completes]
        if not rows:
            return [None] * len(batch)
        last = md.query_start_loc[1:].long() - 1
        logits = self.model.compute_logits(hidden[last[rows]])
        tokens = sample(logits, [batch[i].request for i in rows], self.generator)
        result: list[int | None] = [None] * len(batch)
        for i, tok in zip(rows, tokens):
            result[i] = tok
        return result
