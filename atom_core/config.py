"""AtomConfig: everything the core needs to build and run a model, whoever the host is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from atom_core.quantization import Fp8Scheme
from atom_kernels import envs

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def parse_dtype(dtype: str | torch.dtype | None, hf_config: Any = None) -> torch.dtype:
    """'auto'/None → the checkpoint's torch_dtype (float32 if none); names and torch dtypes accepted."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        ckpt = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
        if isinstance(ckpt, torch.dtype):
            return ckpt
        return _DTYPES.get(str(ckpt), torch.float32) if ckpt else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of: auto, {', '.join(sorted(_DTYPES))}")
    return _DTYPES[dtype]


@dataclass
class AtomConfig:
    """Built by each host's `atom_translate_config` answer from the host's own config objects (kv_cache_dtype and
    quantization as atom_core.quantization.checkpoint_precision resolved them)."""

    hf_config: Any  # transformers.PretrainedConfig
    model_path: str | None = None
    dtype: torch.dtype = torch.float32
    max_model_len: int = 2048
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    quantization: Fp8Scheme | None = None  # the checkpoint's weight quantization (checkpoint_precision's answer)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enforce_eager: bool = False
    # Qwen3's q/k norm + rotary + KV write as one op, where the host's attention layer lets the model write the cache
    # (native). None: on where supported; True: asked for (a log line where unsupported); False: the unfused ops.
    fused_qk_norm_rope: bool | None = field(default_factory=lambda: envs.ATOM_FUSED_QK_NORM_ROPE)
    # MLA decode metadata (kv_indptr / kv_indices) refilled in place in buffers sized at engine start; False: made
    # afresh every step.
    persistent_mla_decode_metadata: bool = field(default_factory=lambda: envs.ATOM_USE_PERSISTENT_MLA_DECODE_METADATA)

    # Native engine: CUDA graphs also for steps that carry prefill tokens (over a ladder of token counts), not only
    # for decode-only steps; False: those steps run eagerly.
    mixed_cuda_graphs: bool = True

    def __post_init__(self) -> None:
        for name in ("max_model_len", "block_size", "max_num_seqs", "max_num_batched_tokens",
                     "tensor_parallel_size", "pipeline_parallel_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.pipeline_parallel_size != 1:
            raise ValueError("pipeline parallelism is not supported yet: set pipeline_parallel_size=1")

    @property
    def architecture(self) -> str:
        archs = getattr(self.hf_config, "architectures", None) or []
        if not archs:
            raise ValueError("the model's config.json has no 'architectures' entry; add e.g. [\"LlamaForCausalLM\"]")
        return archs[0]
