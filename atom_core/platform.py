"""Platform: what a host tells the core about devices, dtypes and parallel groups."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _gather_single(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return t


@dataclass
class Platform:
    """Answer of the `atom_platform` hook.

    all_reduce(t) sums `t` over the tensor-parallel group (in place allowed) and returns it;
    all_gather(t, dim) concatenates the ranks' `t` along `dim`. Both go through the HOST's groups.
    """

    host: str
    device: torch.device
    tp_rank: int = 0
    tp_size: int = 1
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = _identity
    all_gather: Callable[..., torch.Tensor] = _gather_single

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank={self.tp_rank} is outside [0, tp_size={self.tp_size})")


def default_device() -> torch.device:
    """The accelerator when one is present, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
