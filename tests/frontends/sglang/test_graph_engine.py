"""A real sglang.Engine on the GPU with atom-core's models and attention backend, SGLang's CUDA graphs on (its
defaults on CUDA: full decode graphs, breakable prefill graphs, radix cache, chunked prefill, the overlap scheduler):
float32 greedy tokens == transformers, prompts of several lengths in one batch (decode graphs replayed with padding
rows), then prompts extending cached ones (radix-cache hits), for every model family: Qwen3, Llama and DeepSeek-V2
with chunked prefill, Qwen3-MoE, DeepSeek-V3 (DeepSeek on SGLang's MLA pool), and Qwen3 with
--enable-torch-compile (SGLang compiles the forward its decode graphs capture: our model and our backend's Python).
For the GPU machine with the carried SGLang (tools/gpu_sglang); set SGLANG_LOG_DECODE_GRAPH_KEY=1 to see each decode
replay in SGLang's log. test_own_model_gpu.py adds SGLang's own models to the comparison.

On CPU SGLang captures graphs only with --enable-torch-compile (its CPUGraphRunner), which needs sgl_kernel's CPU
ops (not installed by `nox -s sglang`), and the `atom` backend refuses CPU graphs: nothing here runs on CPU.
"""

from __future__ import annotations

import pytest

from tests.frontends.native.hf_oracle import hf_greedy
from tests.frontends.sglang.helpers import NEW_TOKENS, followup_prompts
from tests.frontends.sglang.test_moe_engine import CHECKPOINT as MOE

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

# 16-token prefill chunks next to running decodes (MIXED batches run eagerly), prefill graphs off
CHUNKED = dict(chunked_prefill_size=16, enable_mixed_chunk=True, cuda_graph_backend_prefill="disabled")
# torch.compile of the decode graphs' forward for every captured batch size (1, 2, 4, 8)
COMPILED = dict(enable_torch_compile=True, torch_compile_max_bs=8)
# Real DeepSeek configs carry moe_layer_freq and the router's scoring_func / groups, transformers 5's do not; SGLang's
# own DeepSeek (test_own_model_gpu.py, which reuses these engines) reads them. V2-Lite's router: softmax, one group.
# V2's latent 24 wide, not the tiny config's 16: SGLang's Triton MLA decode (its own model's backend there) pads the
# key (latent + rope) and the value (latent) to powers of two and needs both the same (16 + 8 → 32 against 16 did
# not compile, H100 2026-12-07; V3's 24 + 8 → 32 against 24 → 32 ran).
DEEPSEEK_V2 = dict(moe_layer_freq=1, scoring_func="softmax", n_group=1, topk_group=1, kv_lora_rank=24)
DEEPSEEK_V3 = dict(moe_layer_freq=1, scoring_func="sigmoid")
# name: (architecture, checkpoint overrides, engine args)
CASES = {
    "qwen3": ("Qwen3ForCausalLM", {}, {}),
    "llama-chunked": ("LlamaForCausalLM", {}, CHUNKED),
    "qwen3-moe": (*MOE, {}),  # top-3 MoE layers around a dense one
    "deepseek-v2-chunked": ("DeepseekV2ForCausalLM", DEEPSEEK_V2, CHUNKED),  # SGLang's MLA pool, no q-LoRA
    "deepseek-v3": ("DeepseekV3ForCausalLM", DEEPSEEK_V3, {}),  # SGLang's MLA pool
    "qwen3-torch-compile": ("Qwen3ForCausalLM", {}, COMPILED),
}


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_tokens_with_cuda_graphs_match_transformers(checkpoint_factory, atom_graph_tokens, prompts, tmp_path,
                                                           monkeypatch, name):
    arch, overrides, engine_args = CASES[name]
    path = checkpoint_factory(arch, **overrides)
    followups = followup_prompts(prompts)
    # Inductor writes the code it generates under this directory (in SGLang's scheduler process, which inherits
    # the environment): files there show the compile happened rather than being skipped.
    inductor = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    first, second = atom_graph_tokens(path, [prompts, followups], **engine_args)
    assert [o["output_ids"] for o in first + second] == hf_greedy(path, prompts + followups, NEW_TOKENS)
    cached = [o["meta_info"]["cached_tokens"] for o in second]
    assert all(c >= len(p) for c, p in zip(cached, prompts[2:4])), cached
    if engine_args.get("enable_torch_compile"):
        assert inductor.is_dir() and any(f.is_file() for f in inductor.rglob("*")), "torch.compile never ran"
