"""VllmConfig → AtomConfig (the atom_translate_config answer) and the Platform from vLLM's groups."""

from __future__ import annotations

from typing import Any

import torch

from atom_core.config import KV_CACHE_DTYPES, AtomConfig
from atom_core.platform import Platform

_FLOAT_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def is_vllm_config(obj: Any) -> bool:
    from vllm.config import VllmConfig

    return isinstance(obj, VllmConfig)


def _kv_cache_dtype(cache_dtype: str, model_dtype: torch.dtype) -> str:
    """vLLM's cache_dtype string → ours; a float type equal to the model's is our "auto"."""
    if cache_dtype == _FLOAT_NAMES.get(model_dtype):
        return "auto"
    if cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype={cache_dtype!r} is not supported by atom-core's attention (supported: "
            f"{', '.join(KV_CACHE_DTYPES)}, or the model dtype); pick one of those, or set "
            "ATOM_DISABLE_VLLM_PLUGIN=1 to run vLLM's own implementation")
    return cache_dtype


def to_atom_config(vllm_config: Any) -> AtomConfig:
    model, cache = vllm_config.model_config, vllm_config.cache_config
    par, sched = vllm_config.parallel_config, vllm_config.scheduler_config
    if model is None:
        raise ValueError("VllmConfig.model_config is None: atom-core needs the model's config to build it")
    quant = getattr(vllm_config, "quant_config", None)
    if quant is not None:  # our layers take no quant_config: the weights would not load, or run unquantized
        raise ValueError(
            f"quantized models ({type(quant).__name__}) are not supported by atom-core's vLLM plugin yet; serve an "
            "unquantized checkpoint without --quantization, or set ATOM_DISABLE_VLLM_PLUGIN=1 to run vLLM's own "
            "implementation")
    return AtomConfig(
        hf_config=model.hf_config,
        model_path=str(model.model),
        dtype=model.dtype,
        max_model_len=model.max_model_len,
        block_size=cache.block_size,
        kv_cache_dtype=_kv_cache_dtype(str(cache.cache_dtype), model.dtype),
        tensor_parallel_size=par.tensor_parallel_size,
        pipeline_parallel_size=par.pipeline_parallel_size,
        max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        enforce_eager=bool(model.enforce_eager),
    )


def _all_gather(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    from vllm.distributed import tensor_model_parallel_all_gather

    return tensor_model_parallel_all_gather(t, dim)


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    from vllm.distributed import tensor_model_parallel_all_reduce

    return tensor_model_parallel_all_reduce(t)


def platform_from_vllm() -> Platform:
    """Device and tensor-parallel rank/size/collectives from vLLM's own groups."""
    from vllm.distributed.parallel_state import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
        model_parallel_is_initialized,
    )
    from vllm.platforms import current_platform

    if not model_parallel_is_initialized():
        raise RuntimeError("vLLM's parallel groups are not initialised: atom-core models are built by "
                           "vLLM's workers (vllm.LLM / vllm serve), not constructed directly")
    if current_platform.device_type == "cpu":
        device = torch.device("cpu")
    else:
        device = torch.device(current_platform.device_type, torch.accelerator.current_device_index())
    return Platform(
        host="vllm",
        device=device,
        tp_rank=get_tensor_model_parallel_rank(),
        tp_size=get_tensor_model_parallel_world_size(),
        all_reduce=_all_reduce,
        all_gather=_all_gather,
    )
