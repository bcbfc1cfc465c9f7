"""Incremental detokenization and stop strings, as vLLM's detokenizer does them.

Each step decodes only the tokens since `prefix_offset` (a few): the text they add is the decode of
ids[prefix_offset:] minus the decode of ids[prefix_offset:read_offset]. A decode that ends in U+FFFD is an
unfinished multi-byte character (byte-level BPE splits UTF-8 across tokens): it is held back until the
bytes that complete it arrive, so the accumulated text equals tokenizer.decode(ids) of the same tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tokenizers

REPLACEMENT = "\ufffd"


def decoder(tokenizer) -> Callable[[list[int]], str]:
    """ids → text as tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) gives it.
    A fast tokenizer's decode is its Rust backend's plus ~25 us of Python per call (twice per streamed token: the
    server's main per-token cost under load), so its backend is called directly; a slow tokenizer's decode as is."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, tokenizers.Tokenizer):
        return functools.partial(backend.decode, skip_special_tokens=True)
    return functools.partial(tokenizer.decode, skip_special_tokens=True, clean_up_tokenization_spaces=False)


class Detokenizer:
    def __init__(self, tokenizer, stop: list[str], include_stop_str_in_output: bool, incremental: bool = False) -> None:
        """incremental: decode as tokens come even with no stop strings (streaming shows the text so far)."""
        self.stop, self.include_stop = stop, include_stop_str_in_output
        self._decode = decoder(tokenizer)
        self.incremental = incremental or bool(stop)
        self.ids: list[int] = []
        self.text = ""
        self.prefix_offset = self.read_offset = 0

    def add(self, token_id: int, check_stop: bool = True) -> str | None:
        """Append one token; return the stop string it completed (the text is then cut there), else None.
        check_stop=False (within min_tokens, as vLLM): the text this token adds is not searched."""
        self.ids.append(token_id)
        if not self.incremental:  # nothing to watch for or show: finish() decodes the whole output once
            return None
        before = len(self.text)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            self.text += full[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self._check_stop(len(self.text) - before) if check_stop else None

    def _check_stop(self, new_chars: int) -> str | None:
        """The stop string that appears first in the text, searching only where the new characters could
        complete one; the text is cut before it (or after it with include_stop_str_in_output)."""
        if not new_chars or not self.stop:
            return None
        found = []
        for s in self.stop:
            at = self.text.find(s, max(0, len(self.text) - new_chars - len(s) + 1))
            if at >= 0:
                found.append((at + len(s), at, s))  # the one that completes first wins
        if not found:
            return None
        end, at, s = min(found)
        self.text = self.text[: end if self.include_stop else at]
        return s

    def finish(self) -> None:
        """The sequence ended (not at a stop string): decode what is left, a held-back unfinished character
        included (as tokenizer.decode(ids) shows it), or everything when there were no stop strings."""
        full = self._decode(self.ids[self.prefix_offset :])
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        if len(full) > len(prefix):
            self.text += full[len(prefix) :]
