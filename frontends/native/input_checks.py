"""Checks of what a caller hands the native engine: prompts (tokenized here when given as text) and sampling
params. The offline engine runs them in its own process; `atom-core serve` runs them in the server process,
so the engine process gets only token ids and checked params."""

from __future__ import annotations

import dataclasses

from atom_frontends.native.sampling_params import SamplingParams


class InputChecks:
    def __init__(self, tokenizer, vocab_size: int, max_model_len: int) -> None:
        self.tokenizer, self.vocab_size, self.max_model_len = tokenizer, vocab_size, max_model_len

    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty: give at least one character or token")
            if self.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer: pass prompts as lists of token ids")
            return prompt, list(self.tokenizer(prompt).input_ids)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise TypeError(f"a prompt must be a str or a list of int token ids, got {type(prompt).__name__}")

    def validate_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("the prompt is empty: give at least one token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token id(s) {bad[:5]} outside the vocabulary [0, {self.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens but max_model_len={self.max_model_len} leaves no room to "
                "generate; shorten the prompt or raise max_model_len"
            )

    def check_prompt(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt the engine can serve; raises ValueError/TypeError otherwise."""
        text, ids = self.tokenize(prompt)
        self.validate_prompt(ids)
        return text, ids

    def check_params(self, params: SamplingParams | None) -> SamplingParams:
        """A validated copy of params: the request keeps the copy, so changing params later cannot reach it."""
        if params is None:
            return SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        params = dataclasses.replace(params)  # runs __post_init__, i.e. SamplingParams.validate()
        if params.stop and self.tokenizer is None:
            raise ValueError("SamplingParams.stop needs a tokenizer and this checkpoint has none; "
                             "use stop_token_ids instead")
        return params
