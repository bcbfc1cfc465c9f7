"""LLM: the offline entry point of the native engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from tqdm.auto import tqdm

from atom_frontends.native.engine import LLMEngine
from atom_frontends.native.engine_args import EngineArgs
from atom_frontends.native.request import RequestOutput
from atom_frontends.native.sampling_params import SamplingParams

Prompt = str | list[int]
T = TypeVar("T")


def _labelled(label: str, check: Callable[..., T], *args) -> T:
    """check(*args), with `label` (which prompt or params) prefixed to its ValueError/TypeError."""
    try:
        return check(*args)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{label}: {e}") from None


def _prompt_list(prompts) -> list:
    if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a str, a list of token ids or a list of those, got {type(prompts).__name__}")
    return list(prompts)


def render_chat(tokenizer, conversation, chat_template: str | None, add_generation_prompt: bool,
                 kwargs: dict) -> tuple[str, list[int]]:
    """(rendered text, its token ids) of one conversation (LLM.chat and the server's chat endpoint)."""
    if not (isinstance(conversation, list) and conversation
            and all(isinstance(m, dict) and "role" in m and "content" in m for m in conversation)):
        raise TypeError("a conversation must be a non-empty list of {'role': ..., 'content': ...} dicts, got "
                        f"{conversation!r:.80}")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("the checkpoint's tokenizer has no chat template: pass chat_template=... (a Jinja "
                         "template) or use generate()")
    text = tokenizer.apply_chat_template(conversation, chat_template=chat_template, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kwargs)
    return text, list(tokenizer(text, add_special_tokens=False).input_ids)


def _checked_params(engine: LLMEngine, sampling_params, n: int) -> list[SamplingParams]:
    """One validated SamplingParams per prompt (sampling_params: one for all, or a list of n)."""
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        return [_labelled("sampling_params", engine.inputs.check_params, sampling_params)] * n
    if not isinstance(sampling_params, (list, tuple)):
        raise TypeError("sampling_params must be a SamplingParams or a list of them (one per prompt), got "
                        f"{type(sampling_params).__name__}")
    if len(sampling_params) != n:
        raise ValueError(f"got {len(sampling_params)} SamplingParams for {n} prompts; pass one or one per prompt")
    return [_labelled(f"sampling_params[{i}]", engine.inputs.check_params, sp) for i, sp in enumerate(sampling_params)]


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
        engine, prompts = self.engine, _prompt_list(prompts)
        # Check every SamplingParams and every prompt before queueing any: bad input leaves the engine clean.
        params = _checked_params(engine, sampling_params, len(prompts))
        checked = [_labelled(f"prompt {i}", engine.inputs.check_prompt, p) for i, p in enumerate(prompts)]
        return self._run(checked, params, use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """One conversation (a list of {"role": ..., "content": ...} messages) or a list of them → one output
        each, in order. A conversation is rendered with the checkpoint's chat template (or `chat_template`)
        and tokenized without adding special tokens (the template writes them), as vLLM does."""
        engine = self.engine
        if engine.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer: LLM.chat needs one with a chat template; "
                             "use generate() with token ids")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        params = _checked_params(engine, sampling_params, len(conversations))
        rendered = [_labelled(f"conversation {i}", render_chat, engine.tokenizer, conv, chat_template,
                              add_generation_prompt, chat_template_kwargs or {})
                    for i, conv in enumerate(conversations)]
        for i, (_, ids) in enumerate(rendered):
            _labelled(f"conversation {i}", engine.inputs.validate_prompt, ids)
        return self._run(rendered, params, use_tqdm)

    def _run(self, checked: list[tuple[str | None, list[int]]], params: list[SamplingParams],
             use_tqdm: bool) -> list[RequestOutput]:
        """Queue checked (text, token ids) prompts with their checked params; run until all finish."""
        engine = self.engine
        ids = [engine.enqueue(text, token_ids, sp) for (text, token_ids), sp in zip(checked, params)]
        order = {rid: i for i, rid in enumerate(ids)}
        results: list[RequestOutput | None] = [None] * len(ids)
        bar = tqdm(total=len(ids), desc="generating", disable=not use_tqdm or len(ids) < 2)
        with bar:
            while engine.has_unfinished():
                for out in engine.step():
                    if out.request_id in order:
                        results[order[out.request_id]] = out
                        bar.update(1)
        return results  # type: ignore[return-value]
