"""Vocab-parallel token embedding and LM head (tied or untied).

With tensor parallelism each rank holds a contiguous slice of ceil(vocab / tp) rows (the last
rank's slice is zero-padded). Embedding lookups mask foreign ids and all-reduce; the LM head
all-gathers the vocab slices of the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import atom_kernels
from atom_core.platform import Platform
from atom_core.plugins import current_platform


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, platform: Platform | None = None) -> None:
        super().__init__()
        self.platform = platform or current_platform()
        tp, rank = self.platform.tp_size, self.platform.tp_rank
        self.num_embeddings = num_embeddings
        self.per_rank = -(-num_embeddings // tp)
        self.start = rank * self.per_rank
        self.end = min(self.start + self.per_rank, num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.per_rank, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if loaded.shape[0] != self.num_embeddings or loaded.shape[1] != param.shape[1]:
            raise ValueError(f"embedding shape mismatch: checkpoint {tuple(loaded.shape)}, model expects "
                             f"({self.num_embeddings}, {param.shape[1]})")
        param.data.zero_()
        param.data[: self.end - self.start].copy_(loaded[self.start : self.end])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] → [T, hidden]"""
        if self.platform.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        foreign = (input_ids < self.start) | (input_ids >= self.end)
        out = F.embedding((input_ids - self.start).masked_fill(foreign, 0), self.weight)
        out.masked_fill_(foreign.unsqueeze(-1), 0)
        return self.platform.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits = hidden @ weight^T over this rank's vocab slice, gathered to the full vocab."""

    packed = None  # atom_kernels.pack_linear's answer for the loaded (or tied) weight, made by prepare_weights

    def prepare_weights(self) -> None:
        self.packed = atom_kernels.pack_linear(self.weight)

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] → logits [N, vocab]"""
        logits = atom_kernels.linear(hidden, self.weight, None, self.packed)
        if self.platform.tp_size > 1:
            logits = self.platform.all_gather(logits, -1)
        return logits[..., : self.num_embeddings]
