"""OpenAI response bodies (as vLLM's OpenAI server shapes them) built from the engine's outputs.

A choice's index is prompt_index * n + sample index (vLLM's rule for several prompts with n samples).
Log-probabilities below -9999 are written as -9999 (JSON has no -inf), as vLLM does.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from atom_frontends.native.request import CompletionOutput, Logprob

LOGPROB_FLOOR = -9999.0


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse(body: dict | str) -> str:
    """One server-sent event: `data: <json>` (or `data: [DONE]`) and a blank line."""
    return f"data: {body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _token(t: int, lp: Logprob, as_ids: bool) -> str:
    return f"token_id:{t}" if as_ids or lp.decoded_token is None else lp.decoded_token


@dataclass
class Choice:
    """One choice's text, tokens and logprobs, added up from deltas (a non-streamed answer)."""
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def add(self, c: CompletionOutput) -> None:
        self.text += c.text
        self.token_ids += c.token_ids
        if c.logprobs is not None:
            self.logprobs = (self.logprobs or []) + c.logprobs
        if c.finish_reason is not None:
            self.finish_reason, self.stop_reason = c.finish_reason, c.stop_reason


class Completions:
    """Bodies for /v1/completions: `logprobs` as OpenAI's legacy object (tokens, token_logprobs, top_logprobs
    (the chosen token and the top-k), text_offset)."""

    object, chunk_object = "text_completion", "text_completion"

    def __init__(self, model: str, top_n: int | None, as_ids: bool) -> None:
        self.id, self.created, self.model = new_id("cmpl"), int(time.time()), model
        self.top_n, self.as_ids = top_n, as_ids
        self.offsets: dict[int, int] = {}  # choice index → characters of token text so far (text_offset)

    def logprobs(self, index: int, token_ids: list[int], rows: list[dict[int, Logprob]] | None) -> dict | None:
        if rows is None:
            return None
        out = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for t, row in zip(token_ids, rows):
            token = _token(t, row[t], self.as_ids)
            out["text_offset"].append(self.offsets.get(index, 0))
            self.offsets[index] = self.offsets.get(index, 0) + len(token)
            out["tokens"].append(token)
            out["token_logprobs"].append(max(row[t].logprob, LOGPROB_FLOOR))
            out["top_logprobs"].append({_token(k, lp, self.as_ids): max(lp.logprob, LOGPROB_FLOOR)
                                        for k, lp in row.items()} if self.top_n else None)
        return out

    def choice(self, index: int, c: CompletionOutput | Choice) -> dict:
        return {"index": index, "text": c.text, "logprobs": self.logprobs(index, c.token_ids, c.logprobs),
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}

    def chunk_choice(self, index: int, c: CompletionOutput) -> dict | None:
        """A streamed choice; None when the delta holds nothing. Tokens whose text is held back (part of a
        character, maybe a stop string) still make a chunk with text "", as in vLLM."""
        if not c.text and not c.token_ids and c.finish_reason is None:
            return None
        return self.choice(index, c)

    def body(self, choices: list[dict], usage_: dict | None, chunk: bool = False) -> dict:
        body = {"id": self.id, "object": self.chunk_object if chunk else self.object, "created": self.created,
                "model": self.model, "choices": choices}
        if usage_ is not None or not chunk:
            body["usage"] = usage_
        return body


class ChatCompletions(Completions):
    """Bodies for /v1/chat/completions: `logprobs.content`, each with its top_logprobs sorted by rank."""

    object, chunk_object = "chat.completion", "chat.completion.chunk"

    def __init__(self, model: str, top_n: int | None, as_ids: bool) -> None:
        super().__init__(model, top_n, as_ids)
        self.id = new_id("chatcmpl")
        self.started: set[int] = set()  # choices whose first chunk (with the role) went out

    def _entry(self, t: int, lp: Logprob) -> dict:
        token = _token(t, lp, self.as_ids)
        return {"token": token, "logprob": max(lp.logprob, LOGPROB_FLOOR), "bytes": list(token.encode())}

    def logprobs(self, index: int, token_ids: list[int], rows: list[dict[int, Logprob]] | None) -> dict | None:
        if rows is None:
            return None
        content = []
        for t, row in zip(token_ids, rows):
            top = sorted((kv for kv in row.items() if kv[1].rank is not None and kv[1].rank <= self.top_n),
                         key=lambda kv: kv[1].rank)
            content.append({**self._entry(t, row[t]), "top_logprobs": [self._entry(k, lp) for k, lp in top]})
        return {"content": content}

    def choice(self, index: int, c: CompletionOutput | Choice) -> dict:
        return {"index": index, "message": {"role": "assistant", "content": c.text},
                "logprobs": self.logprobs(index, c.token_ids, c.logprobs),
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}

    def chunk_choice(self, index: int, c: CompletionOutput) -> dict | None:
        """A streamed choice: the first one of an index carries the role; None when it shows nothing."""
        if index in self.started and not c.text and not c.token_ids and c.finish_reason is None:
            return None
        delta = {"content": c.text} if c.text else {}
        if index not in self.started:
            self.started.add(index)
            delta = {"role": "assistant", "content": c.text}
        return {"index": index, "delta": delta, "logprobs": self.logprobs(index, c.token_ids, c.logprobs),
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
