"""What the native engine reads from a checkpoint directory besides the weights: tokenizer and EOS ids."""

from __future__ import annotations

import json
from pathlib import Path


def load_tokenizer(path: str):
    """The checkpoint's tokenizer, or None when it ships none (token-id prompts only)."""
    p = Path(path)
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)


def eos_token_ids(path: str, hf_config) -> frozenset[int]:
    ids: set[int] = set()
    sources = [getattr(hf_config, "eos_token_id", None)]
    gen = Path(path) / "generation_config.json"
    if gen.is_file():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    for src in sources:
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    return frozenset(ids)
