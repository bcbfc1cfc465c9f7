"""A transformers fast tokenizer (tokenizer.json + tokenizer_config.json) from a GGUF's byte-level BPE metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from atom_core.gguf.reader import GGUFFile

# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) → how the text is split before BPE, as llama.cpp splits
# it (llama-vocab.cpp). None: GPT-2's own split (ByteLevel's built-in regex).
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS: dict[str, str | None] = {"gpt2": None, "default": None, "smollm": None, "llama-bpe": _LLAMA3,
                                  "llama3": _LLAMA3, "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2}
_DIGITS_ALONE = ("smollm",)  # llama.cpp splits every digit off first for these
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values
# End-of-turn tokens llama.cpp stops at besides the EOS id (its end-of-generation set, llama-vocab.cpp)
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "<end_of_turn>", "<|eom_id|>")


def _pre_tokenizer(f: GGUFFile):
    from tokenizers import Regex, pre_tokenizers

    pre = f.get("tokenizer.ggml.pre", "default")
    if pre not in _SPLITS:
        raise ValueError(f"{f.path}: pre-tokenizer {pre!r} is not supported; known: {', '.join(sorted(_SPLITS))}")
    split = _SPLITS[pre]
    steps = [pre_tokenizers.Digits(individual_digits=True)] if pre in _DIGITS_ALONE else []
    if split is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    return pre_tokenizers.Sequence(steps)


def build_tokenizer(f: GGUFFile):
    """The `tokenizers.Tokenizer` of a GGUF whose tokenizer.ggml.model is gpt2 (byte-level BPE)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    kind = f.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{f.path}: tokenizer model {kind!r} is not supported (atom-core builds byte-level BPE "
                         "tokenizers, tokenizer.ggml.model 'gpt2': Llama 3, Qwen, SmolLM)")
    tokens = f.require("tokenizer.ggml.tokens")
    types = f.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in f.get("tokenizer.ggml.merges", [])]
    try:
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    except Exception as e:  # the tokenizers library's own error type
        raise ValueError(f"{f.path}: its tokenizer metadata does not make a BPE tokenizer: {e}") from None
    tok.pre_tokenizer = _pre_tokenizer(f)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types)
                    if k == _USER_DEFINED])
    # No BOS post-processor, whatever tokenizer.ggml.add_bos_token says: chat templates write their own special
    # tokens, and transformers' GGUF tokenizer adds none either (same ids as the oracle).
    return tok


def save_tokenizer(f: GGUFFile, out: Path) -> None:
    """tokenizer.json and tokenizer_config.json (special tokens, chat template) into `out`."""
    build_tokenizer(f).save(str(out / "tokenizer.json"))
    tokens = f.require("tokenizer.ggml.tokens")
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                              "model_max_length": int(f.get("{arch}.context_length", 2048))}
    for key, name in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"),
                      ("padding", "pad_token")):
        token_id = f.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            config[name] = tokens[int(token_id)]
    template = f.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))


def stop_token_ids(f: GGUFFile) -> list[int]:
    """EOS, and the end-of-turn tokens of the vocabulary llama.cpp also ends a generation at (SmolLM2's GGUF says
    EOS is <|im_start|>; its answers end with <|im_end|>)."""
    tokens = f.get("tokenizer.ggml.tokens") or []
    ids = [int(f.get("tokenizer.ggml.eos_token_id"))] if f.get("tokenizer.ggml.eos_token_id") is not None else []
    ids += [i for i, t in enumerate(tokens) if t in END_OF_TURN and i not in ids]
    eot = f.get("tokenizer.ggml.eot_token_id")
    if eot is not None and int(eot) not in ids:
        ids.append(int(eot))
    return ids
