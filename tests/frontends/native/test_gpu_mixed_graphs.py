"""Steps with prefill tokens as CUDA graphs (cuda_graphs.StepGraphs' token-count shapes) on a GPU, fp32: an engine
with them and one with decode-only graphs (mixed_cuda_graphs=False) give the same greedy tokens, equal to
transformers', over prefills alone, prefills beside decodes (more requests than sequence slots: each one freed is
taken by a waiting prompt), chunks of prompts longer than the step budget, prefix-cache hits, with overlap
scheduling on and off; and the mixed shapes did replay. test_mixed_graph_steps.py checks the padding itself on a CPU
(padded vs unpadded steps, the KV cache bit for bit).
"""

from __future__ import annotations

import pytest
import torch

from atom_frontends.native import SamplingParams
from tests.frontends.native.hf_oracle import random_prompts
from tests.frontends.native.test_gpu_parity import hf_greedy, native
from tests.frontends.native.test_overlap import assert_all_free

pytestmark = pytest.mark.gpu
CASES = {
    "qwen3": ("Qwen3ForCausalLM", {}),
    "llama-untied": ("LlamaForCausalLM", {}),
    "qwen3-moe": ("Qwen3MoeForCausalLM", {}),
    "deepseek-v3": ("DeepseekV3ForCausalLM", {}),  # MLA prefill + decode kernels in one graph
}
NEW = 16


@pytest.fixture(autouse=True)
def ieee_fp32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def mixed_replays(llm) -> list[tuple[int, int]]:
    """Spy on the graphs' replays: (tokens, seqs) of each replayed shape (decode shapes have tokens == seqs)."""
    graphs, seen = llm.engine.runner.graphs, []
    replay = graphs.replay

    def spy(shape):
        seen.append((shape.tokens, shape.seqs))
        return replay(shape)

    graphs.replay = spy
    return seen


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize("case", list(CASES))
def test_mixed_graphs_on_and_off_give_hf_greedy_tokens(checkpoint_factory, case, overlap):
    arch, overrides = CASES[case]
    path = checkpoint_factory(arch, **overrides)
    head = random_prompts([20], seed=40)[0]
    prompts = random_prompts([3, 17, 40, 9, 100, 15, 16, 33], seed=41) + [head + [5, 6], head + [7]]
    want = hf_greedy(path, prompts, NEW)
    outs = {}
    for mixed in (True, False):
        llm = native(path, "float32", False, max_num_seqs=4, max_num_batched_tokens=48, overlap_scheduling=overlap,
                     mixed_cuda_graphs=mixed)
        seen = mixed_replays(llm)
        res = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW), use_tqdm=False)
        outs[mixed] = [o.outputs[0].token_ids for o in res]
        assert any(t != s for t, s in seen) == mixed  # token-count shapes replayed only with mixed graphs on
        assert any(t == s for t, s in seen)  # decode shapes in both
        assert_all_free(llm)
    assert outs[True] == outs[False] == want


def test_single_prompt_is_one_replay_per_step(checkpoint_factory):
    """One request alone: its prefill (17 tokens → the 32-token shape) and its decodes are graph replays."""
    path = checkpoint_factory("Qwen3ForCausalLM")
    llm = native(path, "float32", False)
    seen = mixed_replays(llm)
    prompt = random_prompts([17], seed=42)
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == hf_greedy(path, prompt, 8)[0]
    assert seen[0][0] == 32 and [t for t, _ in seen[1:]] == [1] * 7
