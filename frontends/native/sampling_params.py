"""SamplingParams: how one request is decoded."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # in (0, 1]
    top_k: int = -1  # -1 (or 0) = all tokens
    max_tokens: int = 16
    min_tokens: int = 0  # EOS/stop tokens are masked until this many tokens exist
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None  # per-request RNG; None = the engine's generator

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(f"SamplingParams: {msg}")

        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise TypeError(f"SamplingParams: temperature must be a number, got {type(self.temperature).__name__}")
        if self.temperature < 0:
            bad(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            bad(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k not in (-1, 0)):
            bad(f"top_k must be -1/0 (disabled) or a positive int, got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            bad(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            bad(f"min_tokens must be an int in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            bad(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise TypeError(f"SamplingParams: seed must be an int or None, got {type(self.seed).__name__}")
        self.stop_token_ids = list(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
