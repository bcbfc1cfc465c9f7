"""vLLM's data parallelism (--data-parallel-size) for atom-core's MoE layers: the Platform's DP rank and size from
vLLM's DP group, and the token dispatch around the experts (Platform.dispatch / combine) through that group.

Each DP rank runs its own requests, and in every step vLLM tells each rank how many tokens every rank has (the
forward context's dp_metadata; a rank without requests runs a dummy batch, so all ranks step together). dispatch pads
this rank's rows to the most any rank has and all-gathers them over the DP group: [dp_size * T_max, ...], the
padding zeros, i.e. routed to expert 0 with weight 0. combine reduce-scatters the experts' partial output over the
group, so each rank gets its own rows summed over the ranks, and keeps its first T_local. Both are custom ops, opaque
to vLLM's torch.compile: they read the forward context when they run, as vLLM's own MoE does inside its op. Their fake
shapes assume what vLLM does whenever it compiles: every rank padded to the same token count.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F


def _dp_group():
    from vllm.distributed.parallel_state import get_dp_group

    return get_dp_group()


def _max_tokens(local: int) -> int:
    """The most tokens any DP rank has in this step (vLLM's dp_metadata)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    meta = get_forward_context().dp_metadata if is_forward_context_available() else None
    if meta is None:  # gathering without the counts would hang the ranks whose counts differ
        raise RuntimeError("atom-core's MoE under vLLM data parallelism ran outside a forward context with "
                           "dp_metadata: every DP rank's token count is needed to gather the tokens")
    counts = meta.num_tokens_across_dp_cpu
    if int(counts[_dp_group().rank_in_group]) != local:
        raise RuntimeError(f"this DP rank has {local} tokens, but vLLM's dp_metadata says {counts.tolist()}")
    return int(counts.max())


@torch.library.custom_op("atom_vllm::dp_gather", mutates_args=())
def dp_gather(x: torch.Tensor) -> torch.Tensor:
    """x [T_local, ...] → [dp_size * T_max, ...]: every DP rank's rows, each rank's padded with zeros to T_max."""
    pad = _max_tokens(x.shape[0]) - x.shape[0]
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 1) + (0, pad))
    return _dp_group().all_gather(x.contiguous(), 0)


@dp_gather.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(_dp_group().world_size * x.shape[0], *x.shape[1:])


@torch.library.custom_op("atom_vllm::dp_combine", mutates_args=())
def dp_combine(out: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """out [dp_size * T_max, H] (the experts' partial sums over every rank's rows) → this rank's [T_local, H],
    summed over the DP ranks; local: this rank's MoE input (its row count)."""
    return _dp_group().reduce_scatter(out.contiguous(), 0)[:local.shape[0]].contiguous()


@dp_combine.register_fake
def _(out: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    return out.new_empty(local.shape[0], *out.shape[1:])


def dispatch(hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return dp_gather(hidden), dp_gather(topk_weights), dp_gather(topk_ids)


def data_parallel_fields(vllm_config: Any) -> dict[str, Any]:
    """The Platform's dp_rank, dp_size, dispatch and combine under vLLM's data parallelism; {} without it."""
    par = getattr(vllm_config, "parallel_config", None)
    if par is None or par.data_parallel_size == 1:
        return {}
    group = _dp_group()
    return dict(dp_rank=group.rank_in_group, dp_size=group.world_size, dispatch=dispatch, combine=dp_combine)
