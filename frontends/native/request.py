"""A request's state inside the native engine, and what the user gets back."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from atom_frontends.native.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str  # "stop" (EOS / stop token) or "length" (max_tokens / max_model_len)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first schedule


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int]
    output_token_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # of the full, computed blocks
    num_cached_tokens: int = -1  # prefix-cache hit at first schedule (-1: not scheduled yet)
    finish_reason: str | None = None
    generator: torch.Generator | None = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def stop_ids(self) -> set[int]:
        """Token ids that end the request (once min_tokens is reached)."""
        ids = set(self.params.stop_token_ids)
        return ids if self.params.ignore_eos else ids | self.eos_token_ids
