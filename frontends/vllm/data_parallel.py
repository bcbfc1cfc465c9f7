"""vLLM's data parallelism (--data-parallel-size) for atom-core's MoE layers: the Platform's DP rank and size from
vLLM's DP group, and its data_parallel_experts: the experts of a rank run over every DP rank's tokens.

Each DP rank runs its own requests, and in every step vLLM tells each rank how many tokens every rank has (the
forward context's dp_metadata; a rank without requests runs a dummy batch, so all ranks step together). One custom
op per MoE layer call, `atom_vllm::dp_experts`, pads this rank's rows (hidden, routing) to the most any rank has and
all-gathers them over vLLM's DP group ([dp_size * T_max, ...]; the padding zeros: routed to expert 0 with weight
0), runs the layer's local_forward (the experts this rank holds) on them, reduce-scatters the partial output over
the group (each rank's rows summed over the ranks) and keeps this rank's T_local rows. The op is opaque to vLLM's
torch.compile and its output has its input's shape, so the per-step token counts never enter a traced graph (vLLM's
own MoE does the same inside its op); it finds its layer by name in vLLM's static forward context, where
register_experts puts every MoE experts module of the model at construction, as vLLM's own layers register.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

_NAMES: dict[int, str] = {}  # id(experts module) → its name in vLLM's static forward context


def _dp_group():
    from vllm.distributed.parallel_state import get_dp_group

    return get_dp_group()


def _step_context(local: int):
    """(vLLM's forward context, the most tokens any DP rank has in this step: its dp_metadata)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    context = get_forward_context() if is_forward_context_available() else None
    if context is None or context.dp_metadata is None:  # gathering without the counts would hang unequal ranks
        raise RuntimeError("atom-core's MoE under vLLM data parallelism ran outside a forward context with "
                           "dp_metadata: every DP rank's token count is needed to gather the tokens")
    counts = context.dp_metadata.num_tokens_across_dp_cpu
    if int(counts[_dp_group().rank_in_group]) != local:
        raise RuntimeError(f"this DP rank has {local} tokens, but vLLM's dp_metadata says {counts.tolist()}")
    return context, int(counts.max())


def _gather(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [T_local, ...] padded with zeros to `rows`, all-gathered over the DP group: [dp_size * rows, ...]."""
    if rows > x.shape[0]:
        x = F.pad(x, (0, 0) * (x.dim() - 1) + (0, rows - x.shape[0]))
    return _dp_group().all_gather(x.contiguous(), 0)


@torch.library.custom_op("atom_vllm::dp_experts", mutates_args=())
def dp_experts(hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
               layer_name: str) -> torch.Tensor:
    """hidden [T_local, H], routing [T_local, K] → [T_local, H]: the named layer's experts over every DP rank's
    tokens, summed over the DP ranks."""
    context, rows = _step_context(hidden.shape[0])
    experts = context.no_compile_layers[layer_name]
    out = experts.local_forward(*(_gather(x, rows) for x in (hidden, topk_weights, topk_ids)))
    return _dp_group().reduce_scatter(out.contiguous(), 0)[:hidden.shape[0]].contiguous()


@dp_experts.register_fake
def _(hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, layer_name: str) -> torch.Tensor:
    return torch.empty_like(hidden)


def data_parallel_experts(experts: nn.Module, hidden: torch.Tensor, topk_weights: torch.Tensor,
                          topk_ids: torch.Tensor) -> torch.Tensor:
    """The Platform's data_parallel_experts under vLLM (the module doc)."""
    return torch.ops.atom_vllm.dp_experts(hidden, topk_weights, topk_ids, _NAMES[id(experts)])


def register_experts(vllm_config: Any, model: nn.Module, prefix: str) -> None:
    """Put every MoE experts module of `model` that runs data-parallel into vLLM's static forward context, named
    `prefix` + its module path (dp_experts finds it there, also in a graph loaded from vLLM's compile cache)."""
    context = vllm_config.compilation_config.static_forward_context
    for name, module in model.named_modules():
        platform = getattr(module, "platform", None)
        if hasattr(module, "local_forward") and platform is not None and platform.dp_size > 1:
            key = f"{prefix}{name}"
            if key in context:
                raise ValueError(f"duplicate layer name {key!r} in vLLM's forward context")
            context[key], _NAMES[id(module)] = module, key


def data_parallel_fields(vllm_config: Any) -> dict[str, Any]:
    """The Platform's dp_rank, dp_size and data_parallel_experts under vLLM's data parallelism; {} without it."""
    par = getattr(vllm_config, "parallel_config", None)
    if par is None or par.data_parallel_size == 1:
        return {}
    group = _dp_group()
    return dict(dp_rank=group.rank_in_group, dp_size=group.world_size, data_parallel_experts=data_parallel_experts)
