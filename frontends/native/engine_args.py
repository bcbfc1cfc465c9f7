"""EngineArgs: the native host's own config object (what `LLM(...)` takes)."""

from __future__ import annotations

from dataclasses import dataclass

from atom_core.config import AtomConfig, parse_dtype
from atom_core.layers.rotary import rope_parameters
from atom_core.loader import load_hf_config


@dataclass
class EngineArgs:
    model: str
    dtype: str = "auto"
    max_model_len: int | None = None  # default: the checkpoint's max_position_embeddings
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # token budget of one step; longer prompts are chunked
    block_size: int = 16
    num_kv_blocks: int | None = None  # explicit KV cache size in blocks ...
    kv_cache_memory: int | None = None  # ... or in bytes (default: 1 GiB on CPU, 85% of free GPU memory)
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    seed: int = 0

    def to_atom_config(self) -> AtomConfig:
        hf_config = load_hf_config(self.model)
        max_pos = getattr(hf_config, "max_position_embeddings", None)
        max_model_len = self.max_model_len or max_pos or 2048
        if max_pos and max_model_len > max_pos:
            if rope_parameters(hf_config)["rope_type"] == "default":
                raise ValueError(f"max_model_len={max_model_len} exceeds the checkpoint's max_position_embeddings="
                                 f"{max_pos} and it has no rope scaling; lower max_model_len")
        return AtomConfig(
            hf_config=hf_config, model_path=str(self.model), dtype=parse_dtype(self.dtype, hf_config),
            max_model_len=max_model_len, block_size=self.block_size, kv_cache_dtype=self.kv_cache_dtype,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            enforce_eager=self.enforce_eager,
        )
