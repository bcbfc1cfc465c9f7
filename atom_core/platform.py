"""Platform: what a host tells the core about devices, dtypes and parallel groups."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _gather_single(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return t


EXPERT_PLACEMENTS = ("linear", "round_robin")


@dataclass
class Platform:
    """Answer of the `atom_platform` hook.

    all_reduce(t) sums `t` over the tensor-parallel group (in place allowed) and returns it;
    all_gather(t, dim) concatenates the ranks' `t` along `dim`. Both go through the HOST's groups.

    Data parallelism (vLLM's --data-parallel-size, SGLang's DP attention; default none): dp_size engine ranks each run
    their own requests through the whole model (attention and dense layers tensor-parallel inside the rank's own TP
    group; under SGLang's DP attention, whole on each rank) except the MoE experts, which are split over the MoE
    group of all dp_size x tp_size ranks, moe_rank = dp_rank * tp_size + tp_rank. `data_parallel_experts(experts,
    hidden, topk_weights, topk_ids)` (required with dp_size > 1) runs `experts.local_forward` (the experts this rank
    holds) over the tokens of every DP rank and returns this rank's share of its rows [T_local, H]: summed over the
    tensor-parallel group (FusedExperts' all_reduce), the shares give the rows summed over the whole MoE group. vLLM's
    share: the rows summed over the DP ranks; SGLang's (attention-TP size 1): the complete rows.

    Expert parallelism (the host's layout; default none): the MoE layers' experts are split over ep_size ranks of
    the MoE group, each rank holding whole experts (its `local_experts`) and, when ep_size is less than the group,
    a 1/moe_tp_size slice of their intermediate dim. Ranks are laid out as vLLM and SGLang lay them out:
    moe_rank = ep_rank * moe_tp_size + moe_tp_rank. Every rank's partial MoE output is summed over the group: first
    inside `data_parallel_experts` (its share, above), then with `all_reduce` over the tensor-parallel group. Which
    experts a rank holds is the host's `expert_placement`: "linear" (contiguous ranges) or "round_robin" (expert e on
    rank e % ep_size).
    """

    host: str
    device: torch.device
    tp_rank: int = 0
    tp_size: int = 1
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = _identity
    all_gather: Callable[..., torch.Tensor] = _gather_single
    ep_rank: int = 0
    ep_size: int = 1
    expert_placement: str = "linear"
    dp_rank: int = 0
    dp_size: int = 1
    data_parallel_experts: Callable[..., torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank={self.tp_rank} is outside [0, tp_size={self.tp_size})")
        if not 0 <= self.dp_rank < self.dp_size:
            raise ValueError(f"dp_rank={self.dp_rank} is outside [0, dp_size={self.dp_size})")
        if self.dp_size > 1 and self.data_parallel_experts is None:
            raise ValueError(f"dp_size={self.dp_size} needs the host's data_parallel_experts (the token exchange "
                             "between data-parallel ranks around the MoE experts)")
        if not 0 <= self.ep_rank < self.ep_size:
            raise ValueError(f"ep_rank={self.ep_rank} is outside [0, ep_size={self.ep_size})")
        if self.moe_size % self.ep_size:
            raise ValueError(f"ep_size={self.ep_size} must divide the MoE group's dp_size x tp_size = {self.moe_size} "
                             "ranks: expert parallelism runs inside it")
        if self.ep_rank != self.moe_rank // self.moe_tp_size:
            raise ValueError(f"ep_rank={self.ep_rank} does not match moe_rank={self.moe_rank} (dp_rank * tp_size + "
                             f"tp_rank): with ep_size={self.ep_size} of {self.moe_size} MoE ranks, rank moe_rank holds "
                             f"the experts of ep_rank moe_rank // {self.moe_tp_size}")
        if self.expert_placement not in EXPERT_PLACEMENTS:
            raise ValueError(f"expert_placement={self.expert_placement!r} is not supported; supported: "
                             f"{', '.join(EXPERT_PLACEMENTS)}")

    @property
    def moe_size(self) -> int:
        """Ranks the MoE experts are split over: dp_size x tp_size."""
        return self.dp_size * self.tp_size

    @property
    def moe_rank(self) -> int:
        return self.dp_rank * self.tp_size + self.tp_rank

    @property
    def moe_tp_size(self) -> int:
        """Ranks sharing each expert (splitting its intermediate dim): moe_size // ep_size."""
        return self.moe_size // self.ep_size

    @property
    def moe_tp_rank(self) -> int:
        return self.moe_rank % self.moe_tp_size

    def local_experts(self, num_experts: int) -> list[int]:
        """Global ids of the experts this rank holds, in the order it stores them (vLLM's determine_expert_map:
        with E % ep_size = r, the first r ranks hold one expert more; SGLang's equal split is the linear case)."""
        if num_experts < self.ep_size:
            raise ValueError(f"expert parallelism over ep_size={self.ep_size} ranks needs at least as many experts, "
                             f"got num_experts={num_experts}")
        if self.expert_placement == "round_robin":
            return list(range(self.ep_rank, num_experts, self.ep_size))
        base, extra = divmod(num_experts, self.ep_size)
        start = self.ep_rank * base + min(self.ep_rank, extra)
        return list(range(start, start + base + (self.ep_rank < extra)))


def default_device() -> torch.device:
    """The accelerator when one is present, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
