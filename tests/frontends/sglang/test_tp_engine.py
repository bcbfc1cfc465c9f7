"""SGLang tensor and expert parallelism on 2 GPUs: a real sglang.Engine with `tp_size=2` (and `ep_size=2` for
Qwen3-MoE) runs atom-core's models and attention backend through SGLang's own TP group and all-reduce, with its
CUDA graphs on; float32 greedy tokens == transformers (and so == TP 1, which test_graph_engine.py checks the same
way). SGLang's CPU path cannot start tp_size=2 (its TP group builds a PyNccl communicator), so nothing here runs on
CPU."""

from __future__ import annotations

import pytest
import torch

from tests.frontends.native.hf_oracle import hf_greedy
from tests.frontends.sglang.helpers import NEW_TOKENS, generate, sglang_engine

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]

MOE = dict(num_experts_per_tok=3, num_hidden_layers=3, mlp_only_layers=[1])
CASES = {  # name → (architecture, checkpoint overrides, engine arguments)
    "qwen3-tp2": ("Qwen3ForCausalLM", {}, dict(tp_size=2)),
    "qwen3-moe-tp2-ep2": ("Qwen3MoeForCausalLM", MOE, dict(tp_size=2, ep_size=2)),
    "qwen3-moe-tp2": ("Qwen3MoeForCausalLM", MOE, dict(tp_size=2)),
    "deepseek-v3-tp2": ("DeepseekV3ForCausalLM", {}, dict(tp_size=2)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_tensor_parallel_greedy_tokens_match_transformers(checkpoint_factory, prompts, name):
    arch, overrides, engine_args = CASES[name]
    path = checkpoint_factory(arch, **overrides)
    with sglang_engine(path, attention_backend="atom", disable_cuda_graph=False, cuda_graph_max_bs_decode=8,
                       **engine_args) as engine:
        outs = generate(engine, prompts)
    assert [o["output_ids"] for o in outs] == hf_greedy(path, prompts, NEW_TOKENS)
