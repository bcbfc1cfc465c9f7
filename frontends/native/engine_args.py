"""EngineArgs: the native host's own config object (what `LLM(...)` takes)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.config import AtomConfig, parse_dtype
from atom_core.gguf import resolve_checkpoint
from atom_core.layers.rotary import rope_parameters
from atom_core.loader import load_hf_config
from atom_core.plugins import current_platform
from atom_core.quantization import checkpoint_precision

LOAD_FORMATS = ("auto", "dummy")
# The step budget unless set, as vLLM's server sets it: BIG_GPU_TOKENS on a GPU of >= BIG_GPU_BYTES (H100, H200),
# else SMALL_TOKENS. On the H200, `atom-core serve` given 512 requests at once (Qwen3-0.6B-shaped, 512 + 128 tokens):
# 25,243 output tok/s with 8192 against 15,921 with 2048 (benchmarks/results/serve-2026-11-29-NVIDIA-H200-budget.txt).
BIG_GPU_BYTES, BIG_GPU_TOKENS, SMALL_TOKENS = 70 << 30, 8192, 2048


def default_max_num_batched_tokens(device: torch.device) -> int:
    if device.type == "cuda" and torch.cuda.get_device_properties(device).total_memory >= BIG_GPU_BYTES:
        return BIG_GPU_TOKENS
    return SMALL_TOKENS


@dataclass
class EngineArgs:
    model: str
    dtype: str = "auto"
    # Default: the checkpoint's max_position_embeddings, lowered to what the KV cache holds (one log line).
    max_model_len: int | None = None
    max_num_seqs: int = 64
    # Token budget of one step (longer prompts are chunked); None: default_max_num_batched_tokens(the device).
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None  # explicit KV cache size in blocks ...
    kv_cache_memory: int | None = None  # ... or in bytes (default: kv_memory.default_kv_cache_bytes)
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    # Overlap scheduling: the CPU schedules and builds step n+1 while the device runs step n, whose sampled
    # tokens are read once step n+1 is launched (the same results). None: the environment variable
    # ATOM_OVERLAP_SCHEDULING (1/0) if set, else on for a CUDA device and off on CPU (nothing to overlap there).
    overlap_scheduling: bool | None = None
    # AtomConfig's switches; None: AtomConfig's default (its environment variable, see atom_kernels.envs).
    fused_qk_norm_rope: bool | None = None
    persistent_mla_decode_metadata: bool | None = None
    mixed_cuda_graphs: bool | None = None  # CUDA graphs for steps with prefill tokens too (enforce_eager: none)
    # Seed of the engine's sampling generator. 0 as in vLLM, so sampled output repeats from run to run;
    # None draws a fresh seed (SamplingParams.seed still seeds single requests).
    seed: int | None = 0
    # No tokenizer in the engine (vLLM's option): prompts come as token ids, outputs carry no text and the caller
    # finds stop strings (`atom-core serve`'s server process does).
    skip_tokenizer_init: bool = False
    # "auto": the checkpoint's weights; "dummy": random ones (atom_core.dummy_weights), only config.json is read, as
    # vLLM's and SGLang's --load-format dummy: a released shape for benchmarks without its files.
    load_format: str = "auto"

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_num_batched_tokens", "num_kv_blocks", "kv_cache_memory"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if self.num_kv_blocks is not None and self.kv_cache_memory is not None:
            raise ValueError("set num_kv_blocks or kv_cache_memory, not both (they size the same KV cache)")
        if self.overlap_scheduling is not None and not isinstance(self.overlap_scheduling, bool):
            raise TypeError(f"overlap_scheduling must be a bool or None, got {self.overlap_scheduling!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise TypeError(f"seed must be an int or None, got {type(self.seed).__name__}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format={self.load_format!r} is not supported; choose one of {LOAD_FORMATS}")
        # A GGUF file (or a directory holding one) loads through its converted HF checkpoint (cached).
        self.model = resolve_checkpoint(self.model, self.dtype)

    def to_atom_config(self) -> AtomConfig:
        hf_config = load_hf_config(self.model)
        dtype = parse_dtype(self.dtype, hf_config)
        precision = checkpoint_precision(hf_config, dtype, self.kv_cache_dtype, model=str(self.model))
        max_pos = getattr(hf_config, "max_position_embeddings", None)
        max_model_len = self.max_model_len or max_pos or 2048
        if max_pos and max_model_len > max_pos:
            if rope_parameters(hf_config)["rope_type"] == "default":
                raise ValueError(f"max_model_len={max_model_len} exceeds the checkpoint's max_position_embeddings="
                                 f"{max_pos} and it has no rope scaling; lower max_model_len")
        budget = self.max_num_batched_tokens or default_max_num_batched_tokens(current_platform().device)
        switches = {name: getattr(self, name) for name in ("fused_qk_norm_rope", "persistent_mla_decode_metadata",
                                                         "mixed_cuda_graphs")
                    if getattr(self, name) is not None}
        return AtomConfig(
            hf_config=hf_config, model_path=str(self.model), dtype=dtype,
            max_model_len=max_model_len, block_size=self.block_size, kv_cache_dtype=precision.kv_cache_dtype,
            quantization=precision.quantization,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=budget,
            enforce_eager=self.enforce_eager, **switches,
        )
