"""VllmConfig → AtomConfig (the atom_translate_config answer) and the Platform from vLLM's groups."""

from __future__ import annotations

import sys
from typing import Any

import torch

from atom_core.config import AtomConfig
from atom_core.platform import Platform
from atom_core.quantization import checkpoint_precision

# How to run the model without atom-core: appended to the errors of checkpoint_precision.
_FALLBACK = "; or set ATOM_DISABLE_VLLM_PLUGIN=1 to run vLLM's own implementation"


def vllm_config_class() -> type | None:
    """vLLM's VllmConfig if vLLM is imported in this process, else None (then no object is one: vLLM is not
    imported just to answer that)."""
    return getattr(sys.modules.get("vllm.config"), "VllmConfig", None)


def to_atom_config(vllm_config: Any) -> AtomConfig:
    model, cache = vllm_config.model_config, vllm_config.cache_config
    par, sched = vllm_config.parallel_config, vllm_config.scheduler_config
    if model is None:
        raise ValueError("VllmConfig.model_config is None: atom-core needs the model's config to build it")
    precision = checkpoint_precision(model.hf_config, model.dtype, str(cache.cache_dtype),
                                     host_quantization=getattr(vllm_config, "quant_config", None),
                                     model=str(model.model), fallback=_FALLBACK)
    return AtomConfig(
        hf_config=model.hf_config,
        model_path=str(model.model),
        dtype=model.dtype,
        max_model_len=model.max_model_len,
        block_size=cache.block_size,
        kv_cache_dtype=precision.kv_cache_dtype,
        quantization=precision.quantization,
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
