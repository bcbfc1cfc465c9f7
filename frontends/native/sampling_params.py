"""SamplingParams: how one request is decoded."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real


def _is_int(v: object) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _is_opt_int(v: object) -> bool:
    return v is None or _is_int(v)


def _is_str_list(v: object) -> bool:
    return v is None or isinstance(v, str) or (isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v))


@dataclass
class SamplingParams:
    n: int = 1  # samples per prompt (they share the prompt's KV blocks)
    presence_penalty: float = 0.0  # in [-2, 2]: subtracted once from every token already in the output
    frequency_penalty: float = 0.0  # in [-2, 2]: subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # > 0, 1 = off: HF's rule over prompt + output tokens
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # in (0, 1]
    top_k: int = -1  # -1 (or 0) = all tokens
    min_p: float = 0.0  # in [0, 1]: drop tokens less likely than min_p times the most likely one
    seed: int | None = None  # per-request RNG (sample i of n uses seed + i); None = the engine's generator
    stop: str | list[str] | None = None  # text that ends a sample; cut from the output text
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int = 16
    min_tokens: int = 0  # EOS/stop tokens are masked until this many tokens exist
    logprobs: int | None = None  # top-n log-probabilities per output token (plus the sampled one)
    prompt_logprobs: int | None = None  # the same for each prompt token

    def __post_init__(self) -> None:
        self.validate()
        self.stop_token_ids = list(self.stop_token_ids)
        self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def validate(self) -> None:
        """Raise TypeError (wrong type) or ValueError (bad value) naming the first bad field. Runs at
        construction and again when a request is queued, as the fields may have been changed since."""
        for name, ok, want in (
            ("n", _is_int, "an int"),
            ("presence_penalty", _is_real, "a number"),
            ("frequency_penalty", _is_real, "a number"),
            ("repetition_penalty", _is_real, "a number"),
            ("min_p", _is_real, "a number"),
            ("stop", _is_str_list, "a str, a list of str or None"),
            ("include_stop_str_in_output", lambda v: isinstance(v, bool), "a bool"),
            ("logprobs", _is_opt_int, "an int or None"),
            ("prompt_logprobs", _is_opt_int, "an int or None"),
            ("temperature", _is_real, "a number"),
            ("top_p", _is_real, "a number"),
            ("top_k", _is_int, "an int"),
            ("max_tokens", _is_int, "an int"),
            ("min_tokens", _is_int, "an int"),
            ("ignore_eos", lambda v: isinstance(v, bool), "a bool"),
            ("seed", _is_opt_int, "an int or None"),
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
        if self.n < 1:
            bad("n", "an int >= 1")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                bad(name, "in [-2, 2]")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            bad("repetition_penalty", "> 0 and finite (1 = off)")
        if not 0 <= self.min_p <= 1:
            bad("min_p", "in [0, 1] (0 = off)")
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if any(not s for s in stops):
            bad("stop", "non-empty strings")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                bad(name, "None (off) or an int >= 0 (how many top tokens besides the chosen one)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)
