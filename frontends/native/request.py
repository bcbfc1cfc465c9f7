"""A request's state inside the native engine, and what the user gets back (vLLM's output classes)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from atom_frontends.native.sampling_params import SamplingParams

if TYPE_CHECKING:
    from atom_frontends.native.detokenizer import Detokenizer


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Logprob:
    """One token's log-probability at one position: log_softmax of the model's raw logits (vLLM's default)."""
    logprob: float
    rank: int | None = None  # 1 = the most likely token
    decoded_token: str | None = None


# one dict per position: token id → Logprob (the sampled or prompt token plus the top-n)
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]  # None for the first prompt token (nothing precedes it)


@dataclass
class CompletionOutput:
    index: int  # which of the request's n samples
    text: str  # "" when the checkpoint ships no tokenizer
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None  # "stop" (EOS, stop token or string), "length", "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it; None for EOS/length

    def finished(self) -> bool:
        return self.finish_reason is not None

    def __reduce__(self):  # pickled as its fields, in order (the engine process sends these each step): ~6x faster
        return CompletionOutput, tuple(self.__dict__.values())  # to unpickle than a dataclass's default state dict


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first schedule


@dataclass
class Request:
    """One sequence the scheduler runs: one of a request's n samples (all n carry the request's id)."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int]
    output_token_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache, or being computed by a launched step
    # Overlap scheduling: tokens sampled by launched steps whose values the CPU has not read yet (0, 1, or 2
    # for a moment), and the row of the latest one in its step's device tensor of sampled tokens.
    num_pending: int = 0
    pending_row: int = 0
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # of the full, computed blocks
    num_cached_tokens: int = -1  # prefix-cache hit at first schedule (-1: not scheduled yet)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    generator: torch.Generator | None = None
    detokenizer: Detokenizer | None = None
    index: int = 0  # sample index within its parent request
    logprobs: SampleLogprobs | None = None  # filled when params.logprobs is set
    cumulative_logprob: float = 0.0  # of the output tokens, kept as they come (outputs read it in O(1))
    num_handed: int | None = None  # streamed requests: output tokens handed out (outputs hold only newer ones)
    prompt_logprobs_handed: bool = False  # streamed requests: their prompt logprobs went out (once, whole)
    prompt_logprobs: PromptLogprobs | None = None  # filled when params.prompt_logprobs is set
    fork_parent: Request | None = None  # n > 1: the sample whose prompt blocks this one shares

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
