"""Stop strings and incremental detokenization, against the transformers tokenizer's own decode."""

from __future__ import annotations

import pytest

from atom_frontends.native import LLM, SamplingParams
from atom_frontends.native.demo import byte_level_tokenizer
from atom_frontends.native.detokenizer import Detokenizer
from tests.frontends.native.hf_oracle import hf_greedy, random_prompts

NEW = 40


@pytest.fixture(scope="module")
def setup(checkpoint_factory):
    """The LLM, a prompt and transformers' greedy tokens for it. Random bytes decode to many U+FFFD: the
    prompt is the first whose reference text has clean stretches to take stop strings from."""
    path = checkpoint_factory("LlamaForCausalLM")
    llm = LLM(path, block_size=4, num_kv_blocks=256)
    for seed in range(41, 61):
        prompt = random_prompts([12], seed=seed)[0]
        ref = hf_greedy(path, [prompt], NEW)[0]
        full = llm.tokenizer.decode(ref, skip_special_tokens=True)
        if _window(full, len(full) // 2, 3) and _window(full, 2 * len(full) // 3, 2) and _window(full, 1, 2):
            return llm, prompt, ref
    raise AssertionError("no prompt with clean text in its reference")


def _expected(tok, ref: list[int], stops: list[str], include: bool = False) -> tuple[str, list[int], str]:
    """The HF reference: tokens up to the first whose decoded prefix contains a stop string, the text cut at
    the stop string that appears first, and which one it is."""
    for k in range(1, len(ref) + 1):
        text = tok.decode(ref[:k], skip_special_tokens=True)
        hits = sorted((text.find(s) + len(s), text.find(s), s) for s in stops if s in text)
        if hits:
            end, at, s = hits[0]
            return text[: end if include else at], ref[:k], s
    raise AssertionError("no stop string in the reference")


def _window(text: str, start: int, n: int) -> str | None:
    """n characters of text from `start` on, none of them U+FFFD."""
    for i in range(start, len(text) - n):
        if "\ufffd" not in text[i : i + n]:
            return text[i : i + n]
    return None


@pytest.mark.parametrize("include", [False, True])
def test_multi_token_stop_string_matches_hf(setup, include):
    llm, prompt, ref = setup
    tok = llm.tokenizer
    full = tok.decode(ref, skip_special_tokens=True)
    stop = _window(full, len(full) // 2, 3)  # three characters: at least three byte tokens
    text, ids, _ = _expected(tok, ref, [stop], include)
    sp = SamplingParams(temperature=0.0, max_tokens=NEW, stop=stop, include_stop_str_in_output=include)
    c = llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0]
    assert (c.text, c.token_ids, c.finish_reason, c.stop_reason) == (text, ids, "stop", stop)
    assert len(ids) < NEW and c.text.endswith(stop) == include


def test_first_stop_string_to_appear_wins(setup):
    llm, prompt, ref = setup
    tok = llm.tokenizer
    full = tok.decode(ref, skip_special_tokens=True)
    late, early = _window(full, 2 * len(full) // 3, 2), _window(full, 1, 2)
    text, ids, first = _expected(tok, ref, [late, early])
    c = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=NEW, stop=[late, early]),
                     use_tqdm=False)[0].outputs[0]
    assert (c.text, c.token_ids, c.stop_reason) == (text, ids, first)


def test_no_stop_string_within_min_tokens(setup):
    """vLLM: a stop string completed by one of the first min_tokens tokens does not count."""
    llm, prompt, ref = setup
    tok = llm.tokenizer
    full = tok.decode(ref, skip_special_tokens=True)
    stop = next(w for i in range(1, len(full)) if (w := _window(full, i, 2)) and full.count(w) == 1)
    _, ids, _ = _expected(tok, ref, [stop])
    assert len(ids) < NEW
    c = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=NEW, stop=stop, min_tokens=len(ids)),
                     use_tqdm=False)[0].outputs[0]
    assert (c.token_ids, c.text, c.finish_reason, c.stop_reason) == (ref, full, "length", None)
    c = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=NEW, stop=stop, min_tokens=len(ids) - 1),
                     use_tqdm=False)[0].outputs[0]
    assert (c.token_ids, c.stop_reason) == (ids, stop)


def test_text_without_stop_equals_hf_decode(setup):
    llm, prompt, ref = setup
    c = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=NEW, stop="never appears"),
                     use_tqdm=False)[0].outputs[0]
    assert c.token_ids == ref and c.text == llm.tokenizer.decode(ref, skip_special_tokens=True)
    assert c.finish_reason == "length" and c.stop_reason is None


@pytest.mark.parametrize("stop", ["世", "é", "o 世", "!"])
def test_detokenizer_multibyte_characters(stop):
    """Byte-level tokens split UTF-8 characters: a stop string made of one 3-byte character ends the text
    only once all its bytes arrived, and every prefix's text equals tokenizer.decode of its tokens."""
    tok = byte_level_tokenizer()
    source = "héllo 世界! ok"
    ids = tok(source, add_special_tokens=False).input_ids
    assert len(ids) > len(source)  # multi-byte characters take several tokens
    d = Detokenizer(tok, [stop], include_stop_str_in_output=False)
    for k, t in enumerate(ids, 1):
        hit = d.add(t)
        decoded = tok.decode(ids[:k])
        if hit is not None:
            assert hit == stop and stop in decoded and stop not in tok.decode(ids[: k - 1])
            assert d.text == decoded[: decoded.index(stop)]
            return
        # text lags decode only by a held-back unfinished character
        assert decoded.startswith(d.text) and set(decoded[len(d.text) :]) <= {"\ufffd"}
    raise AssertionError(f"{stop!r} never matched")


def test_detokenizer_flushes_an_unfinished_character():
    tok = byte_level_tokenizer()
    ids = tok("a世", add_special_tokens=False).input_ids[:-1]  # the character's last byte is missing
    d = Detokenizer(tok, ["never"], include_stop_str_in_output=False)  # a stop string: decoded as it goes
    for t in ids:
        d.add(t)
    assert d.text == "a"
    d.finish()
    assert d.text == tok.decode(ids)


def test_stop_strings_need_a_tokenizer(checkpoint_factory):
    llm = LLM(checkpoint_factory("Qwen3ForCausalLM", tokenizer=False), num_kv_blocks=32)
    with pytest.raises(ValueError, match="stop needs a tokenizer"):
        llm.generate([[4, 5, 6]], SamplingParams(stop="x"), use_tqdm=False)


def test_decoder_is_the_tokenizers_decode():
    """The detokenizer's decode (a fast tokenizer's Rust backend, called directly) gives tokenizer.decode's text for
    any ids: special tokens skipped, no clean-up of spaces; a tokenizer without a backend keeps its own decode."""
    import random

    from atom_frontends.native.detokenizer import decoder

    tok = byte_level_tokenizer()
    assert decoder(tok).func == tok.backend_tokenizer.decode
    rng = random.Random(0)
    ids = [rng.randrange(len(tok)) for _ in range(300)] + tok.all_special_ids + tok("a , b .").input_ids
    for n in (1, 2, 5, 40, len(ids)):
        chunk = ids[-n:]
        assert decoder(tok)(chunk) == tok.decode(chunk, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    class Slow:  # no backend_tokenizer: its decode is called with the same arguments
        def decode(self, ids, **kw):
            return f"{ids}{sorted(kw.items())}"

    assert decoder(Slow())([1]) == "[1][('clean_up_tokenization_spaces', False), ('skip_special_tokens', True)]"
