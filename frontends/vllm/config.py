"""VllmConfig → AtomConfig (the atom_translate_config answer) and the Platform from vLLM's groups."""

from __future__ import annotations

import sys
from typing import Any

import torch

from atom_core.config import AtomConfig
from atom_core.platform import Platform
from atom_core.quantization import checkpoint_precision
from atom_frontends.vllm.data_parallel import data_parallel_fields

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


def expert_parallel_layout(vllm_config: Any, moe_rank: int, moe_size: int) -> dict[str, Any]:
    """The Platform's expert-parallel fields, as vLLM's own FusedMoE lays its experts out
    (fused_moe/config.py FusedMoEParallelConfig.make, expert_map_manager.py): with enable_expert_parallel every rank
    of the MoE group (dp_size x tp_size ranks, moe_rank = dp_rank * tp_size + tp_rank) is an EP rank holding whole
    experts (MoE-TP 1), in the configured expert_placement_strategy; "round_robin" falls back to "linear" unless the
    model routes over expert groups (n_group > 1), as vLLM's determine_expert_placement_strategy does. No config
    (not inside vLLM's model construction) or EP off: {} (no EP: each expert's intermediate dim is split over the
    MoE group's ranks instead)."""
    par = getattr(vllm_config, "parallel_config", None)
    if par is None or not par.enable_expert_parallel:
        return {}
    if par.prefill_context_parallel_size > 1:
        raise ValueError(f"vLLM's enable_expert_parallel with prefill_context_parallel_size="
                         f"{par.prefill_context_parallel_size}: atom-core's MoE layer gathers tokens over data-parallel"
                         " ranks only; run with prefill_context_parallel_size=1, or without --enable-expert-parallel"
                         f"{_FALLBACK}")
    if par.enable_eplb:
        raise ValueError("vLLM's enable_eplb (expert load balancing, redundant experts) is not supported by "
                         f"atom-core's MoE layer; run without --enable-eplb{_FALLBACK}")
    if moe_size == 1:
        return {}
    placement = par.expert_placement_strategy
    groups = getattr(vllm_config.model_config.hf_text_config, "n_group", None)
    if placement == "round_robin" and not (groups is not None and groups > 1):
        placement = "linear"
    return dict(ep_rank=moe_rank, ep_size=moe_size, expert_placement=placement)


def platform_from_vllm() -> Platform:
    """Device, tensor-parallel rank/size/collectives from vLLM's own groups, its data parallelism
    (data_parallel.data_parallel_fields) and its expert-parallel layout (expert_parallel_layout)."""
    from vllm.config import get_current_vllm_config_or_none
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
    tp_rank, tp_size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    vllm_config = get_current_vllm_config_or_none()
    dp = data_parallel_fields(vllm_config)
    dp_rank, dp_size = dp.get("dp_rank", 0), dp.get("dp_size", 1)
    return Platform(
        host="vllm",
        device=device,
        tp_rank=tp_rank,
        tp_size=tp_size,
        all_reduce=_all_reduce,
        all_gather=_all_gather,
        **dp,
        **expert_parallel_layout(vllm_config, dp_rank * tp_size + tp_rank, dp_size * tp_size),
    )
