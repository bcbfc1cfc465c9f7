"""A real sglang.Engine on the GPU with atom-core's models and attention backend, SGLang's CUDA graphs on (its
defaults on CUDA: full decode graphs, breakable prefill graphs, radix cache, chunked prefill, the overlap scheduler):
float32 greedy tokens == transformers, prompts of several lengths in one batch (decode graphs replayed with padding
rows), then prompts extending cached ones. For the GPU machine with the carried SGLang (tools/gpu_sglang); set
SGLANG_LOG_DECODE_GRAPH_KEY=1 to see each decode replay in SGLang's log.

On CPU SGLang captures graphs only with --enable-torch-compile (its CPUGraphRunner), which needs sgl_kernel's CPU
ops (not installed by `nox -s sglang`), and the `atom` backend refuses CPU graphs: nothing here runs on CPU.
"""

from __future__ import annotations

import pytest

from tests.frontends.native.hf_oracle import hf_greedy, random_prompts
from tests.frontends.sglang.helpers import NEW_TOKENS, generate, sglang_engine

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

GRAPHS = dict(device="cuda", disable_cuda_graph=False, cuda_graph_max_bs_decode=8)
CASES = {
    "qwen3": ("Qwen3ForCausalLM", {}),
    # 16-token prefill chunks next to running decodes (MIXED batches run eagerly), prefill graphs off
    "llama-chunked": ("LlamaForCausalLM", dict(chunked_prefill_size=16, enable_mixed_chunk=True,
                                               cuda_graph_backend_prefill="disabled")),
    "deepseek-v3": ("DeepseekV3ForCausalLM", {}),  # SGLang's MLA pool
}


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_tokens_with_cuda_graphs_match_transformers(checkpoint_factory, prompts, name):
    arch, engine_args = CASES[name]
    path = checkpoint_factory(arch)
    followups = [p + tail for p, tail in zip(prompts[2:4], random_prompts([5, 11], seed=3))]
    with sglang_engine(path, attention_backend="atom", **GRAPHS, **engine_args) as engine:
        first = generate(engine, prompts)
        second = generate(engine, followups)
    assert [o["output_ids"] for o in first + second] == hf_greedy(path, prompts + followups, NEW_TOKENS)
