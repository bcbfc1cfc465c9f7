"""The OpenAI request bodies the server takes (pydantic) and their SamplingParams.

Fields are OpenAI's plus the vLLM extras a vLLM user sends (top_k, min_p, repetition_penalty, min_tokens,
ignore_eos, stop_token_ids, include_stop_str_in_output, return_tokens_as_token_ids). Unknown fields are
ignored, as vLLM ignores them; values are checked by SamplingParams, whose errors become HTTP 400.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from atom_frontends.native.sampling_params import SamplingParams


class RequestError(ValueError):
    """A request the server cannot serve as asked: HTTP 400 naming `param`."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    """What /v1/completions and /v1/chat/completions share."""
    model_config = ConfigDict(extra="ignore")

    model: str
    n: int = 1
    max_tokens: int | None = None  # None: up to max_model_len (vLLM's default)
    temperature: float | None = None  # None: 1.0, OpenAI's default
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_tokens_as_token_ids: bool = False  # logprobs name tokens "token_id:<id>" (vLLM's option)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_model_len: int, logprobs: int | None, max_tokens: int | None) -> SamplingParams:
        """SamplingParams of this request; RequestError (HTTP 400) naming the field for a bad value."""
        try:
            return SamplingParams(
                n=self.n, temperature=1.0 if self.temperature is None else self.temperature, top_p=self.top_p,
                top_k=self.top_k, min_p=self.min_p, seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
                include_stop_str_in_output=self.include_stop_str_in_output, ignore_eos=self.ignore_eos,
                max_tokens=max_model_len if max_tokens is None else max_tokens, min_tokens=self.min_tokens,
                presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                repetition_penalty=self.repetition_penalty, logprobs=logprobs)
        except (ValueError, TypeError) as e:
            field = re.match(r"SamplingParams\.(\w+)", str(e))
            raise RequestError(str(e).replace("SamplingParams.", ""), field.group(1) if field else None) from None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None  # top-n per token (OpenAI allows up to 5; vLLM, and we, more)
    echo: bool = False
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """One or more prompts, each a str or a list of token ids."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise RequestError("prompt is empty: give a string, a list of strings or token ids", "prompt")
        return list(p)

    def to_params(self, max_model_len: int) -> SamplingParams:
        if self.echo:
            raise RequestError("echo is not supported by atom-core serve; leave it false", "echo")
        if self.suffix:
            raise RequestError("suffix is not supported by atom-core serve", "suffix")
        return self.sampling_params(max_model_len, self.logprobs, self.max_tokens)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: passed to the chat template

    role: str
    content: str | list[dict] | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template: str | None = None
    chat_template_kwargs: dict | None = None

    def conversation(self) -> list[dict]:
        """The messages as the chat template takes them; content parts other than text are refused."""
        if not self.messages:
            raise RequestError("messages is empty: give at least one message", "messages")
        out = []
        for i, m in enumerate(self.messages):
            d = m.model_dump(exclude_none=True)
            if isinstance(m.content, list):
                kinds = {part.get("type") for part in m.content}
                if kinds - {"text"}:
                    raise RequestError(f"messages[{i}].content: only text parts are supported, got {sorted(kinds)}",
                                       "messages")
                d["content"] = "".join(part.get("text", "") for part in m.content)
            d.setdefault("content", "")
            out.append(d)
        return out

    def to_params(self, max_model_len: int) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs=true", "top_logprobs")
        if self.top_logprobs is not None and self.top_logprobs < 0:
            raise RequestError(f"top_logprobs must be >= 0, got {self.top_logprobs}", "top_logprobs")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_tokens if self.max_completion_tokens is None else self.max_completion_tokens
        return self.sampling_params(max_model_len, logprobs, max_tokens)


ErrorType = Literal["invalid_request_error", "service_unavailable_error", "server_error"]


def error_body(message: str, type_: ErrorType = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
