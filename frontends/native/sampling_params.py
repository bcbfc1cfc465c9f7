"""SamplingParams: how one request is decoded."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real


def _is_int(v: object) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


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
        self.validate()
        self.stop_token_ids = list(self.stop_token_ids)

    def validate(self) -> None:
        """Raise TypeError (wrong type) or ValueError (bad value) naming the first bad field. Runs at
        construction and again when a request is queued, as the fields may have been changed since."""
        for name, ok, want in (
            ("temperature", _is_real, "a number"),
            ("top_p", _is_real, "a number"),
            ("top_k", _is_int, "an int"),
            ("max_tokens", _is_int, "an int"),
            ("min_tokens", _is_int, "an int"),
            ("ignore_eos", lambda v: isinstance(v, bool), "a bool"),
            ("seed", lambda v: v is None or _is_int(v), "an int or None"),
            ("stop_token_ids", lambda v: isinstance(v, (list, tuple, set, frozenset)), "a list of ints"),
        ):
            value = getattr(self, name)
            if not ok(value):
                raise TypeError(f"SamplingParams.{name} must be {want}, got {value!r} ({type(value).__name__})")

        def bad(name: str, rule: str) -> None:
            raise ValueError(f"SamplingParams.{name} must be {rule}, got {getattr(self, name)!r}")

        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            bad("temperature", ">= 0 (0 = greedy) and finite")
        if not 0 < self.top_p <= 1:
            bad("top_p", "in (0, 1]")
        if self.top_k < 1 and self.top_k not in (-1, 0):
            bad("top_k", "-1/0 (disabled) or a positive int")
        if self.max_tokens < 1:
            bad("max_tokens", "an int >= 1")
        if not 0 <= self.min_tokens <= self.max_tokens:
            bad("min_tokens", f"an int in [0, max_tokens={self.max_tokens}]")
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "non-negative ints")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
