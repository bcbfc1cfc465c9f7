"""LLM: the offline entry point of the native engine."""

from __future__ import annotations

from collections.abc import Sequence

from tqdm.auto import tqdm

from atom_frontends.native.engine import LLMEngine
from atom_frontends.native.engine_args import EngineArgs
from atom_frontends.native.request import RequestOutput
from atom_frontends.native.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """`LLM(model=DIR).generate(prompts, SamplingParams(...))` → list[RequestOutput] in prompt order."""

    def __init__(self, model: str, **kwargs) -> None:
        self.engine = LLMEngine(EngineArgs(model=str(model), **kwargs))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        params = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts; pass one or one per prompt")
        # Validate everything before queueing anything, so a bad prompt leaves the engine clean.
        for i, p in enumerate(prompts):
            try:
                self.engine.validate_prompt(self.engine.tokenize(p)[1])
            except (ValueError, TypeError) as e:
                raise type(e)(f"prompt {i}: {e}") from None
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        order = {rid: i for i, rid in enumerate(ids)}
        results: list[RequestOutput | None] = [None] * len(ids)
        bar = tqdm(total=len(ids), desc="generating", disable=not use_tqdm or len(ids) < 2)
        with bar:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.request_id in order:
                        results[order[out.request_id]] = out
                        bar.update(1)
        return results  # type: ignore[return-value]
