"""SGLang's DP attention (--enable-dp-attention --dp-size D, or --attn-dp-size D) for atom-core's models: the
Platform's fields, and its data_parallel_experts through SGLang's own gather and scatter.

SGLang keeps ONE tensor-parallel group of tp_size ranks and splits it into D attention-DP ranks of attn_tp_size =
tp_size / D ranks each. Each attention-DP rank runs its own requests; a rank without any runs IDLE batches, so that
every rank steps together. atom-core runs attn_tp_size 1 (D = tp_size): each rank attends, runs its dense layers and
LM head whole on its own tokens (the Platform's tp_size 1, dp_rank/dp_size = SGLang's attention-DP rank/size), and
the MoE experts are split over all tp_size ranks (moe_rank = SGLang's tp_rank, the --ep-size layout unchanged).
attn_tp_size > 1 is refused: on CPU, tp 4 / dp 2 loads and then fails its first extend step (the attention got more
token rows than the step's metadata: SGLang's communicator lays tokens out over the attention-TP group in ways the
model does not follow yet).

data_parallel_experts runs a MoE layer's local experts over the tokens of every DP rank as SGLang's own models do:
SGLang sized this step's gathered buffer (the forward batch's global_dp_buffer_len, every rank's token count, padded
by SGLang to the most any rank has (MAX_LEN) or laid end to end (SUM_LEN)) before the forward; dp_gather_replicate
gathers the hidden states and the routing (weights and expert ids as one float32 tensor) into that layout, the
layer's local_forward runs the experts this rank holds, and the partial output comes back to this rank's rows summed
over the whole TP group: SGLang's dp_reduce_scatter_tensor under MAX_LEN, else its TP all-reduce then dp_scatter
(SGLang's own choice, layer_boundary/exit.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_FALLBACK = "; or unset SGLANG_EXTERNAL_MODEL_PACKAGE so SGLang uses its own model"


def _gather(x: torch.Tensor, forward_batch: Any) -> torch.Tensor:
    """This rank's rows of x [T_local, ...] → every DP rank's rows [global_dp_buffer_len, ...], in SGLang's layout."""
    from sglang.srt.layers.dp_attention import dp_gather_replicate, get_global_dp_buffer_len

    out = x.new_empty((get_global_dp_buffer_len(), *x.shape[1:]))
    dp_gather_replicate(out, x.contiguous(), forward_batch)
    return out


def _reduce_to_local(out: torch.Tensor, local_rows: int, forward_batch: Any) -> torch.Tensor:
    """Every rank's partial output over the gathered rows [global, H] → this rank's rows [local_rows, H], summed over
    the TP group."""
    from sglang.srt.distributed import tensor_model_parallel_all_reduce
    from sglang.srt.layers.dp_attention import can_use_dp_reduce_scatter, dp_reduce_scatter_tensor, dp_scatter

    local = out.new_empty((local_rows, *out.shape[1:]))
    mode = forward_batch.dp_padding_mode
    if mode is not None and mode.is_max_len() and can_use_dp_reduce_scatter():
        dp_reduce_scatter_tensor(local, out.contiguous())
    else:
        dp_scatter(local, tensor_model_parallel_all_reduce(out.contiguous()), forward_batch)
    return local


def data_parallel_experts(experts: nn.Module, hidden: torch.Tensor, topk_weights: torch.Tensor,
                          topk_ids: torch.Tensor) -> torch.Tensor:
    """The Platform's data_parallel_experts under SGLang's DP attention (the module doc): hidden [T_local, H] and its
    routing → [T_local, H], the MoE output of this rank's tokens over every rank's experts."""
    from atom_frontends.sglang.bridge import current_forward_batch

    forward_batch = current_forward_batch()
    k = topk_ids.shape[1]
    # the routing as one float32 tensor [T, 2K]: one gather, and none of integers (SGLang sums those with a custom op
    # that exists only for CUDA on its non-CPU-engine path); float32 holds expert ids exactly (< 2**24)
    routing = _gather(torch.cat([topk_weights.float(), topk_ids.float()], dim=1), forward_batch)
    weights, ids = routing[:, :k].to(topk_weights.dtype), routing[:, k:].to(topk_ids.dtype)
    out = experts.local_forward(_gather(hidden, forward_batch), weights, ids)
    return _reduce_to_local(out, hidden.shape[0], forward_batch)


def data_parallel_fields(parallel: Any) -> dict[str, Any]:
    """The Platform's tensor- and data-parallel fields under SGLang's DP attention (attention-TP size 1); {} without
    it."""
    if parallel.attn_dp_size == 1:
        return {}
    if parallel.attn_cp_size > 1:
        raise ValueError(f"SGLang's DP attention with attention context parallelism (attn_cp_size="
                         f"{parallel.attn_cp_size}) is not supported by atom-core's SGLang frontend{_FALLBACK}")
    if parallel.attn_tp_size > 1:
        raise ValueError(f"SGLang's DP attention with attention-TP size {parallel.attn_tp_size} (--tp-size / --dp-size "
                         "> 1) is not supported by atom-core's SGLang frontend yet: set --dp-size to --tp-size "
                         f"(attention-TP size 1){_FALLBACK}")
    return dict(tp_rank=0, tp_size=1, dp_rank=parallel.attn_dp_rank, dp_size=parallel.attn_dp_size,
                data_parallel_experts=data_parallel_experts)
