"""DeepSeek-V2/V3 (MLA + MoE) in a real sglang.Engine on CPU: atom-core's models through
SGLANG_EXTERNAL_MODEL_PACKAGE, SGLang's MLA token pool (chosen by the architecture name), our attention
backend's MLA path. Greedy tokens == transformers for prompts of several lengths in one batch, then prompts
extending cached ones (radix-cache hits). SGLang's own DeepSeek does not run on a CPU-only machine (its rope
imports vLLM's op), so transformers is the oracle.

Checkpoints (build_checkpoint's tiny V2 / V3: layer 0 dense, layer 1 MoE + a shared expert): V2 with a 16-wide
latent, no q-LoRA, softmax greedy routing, run with 16-token prefill chunks next to running decodes (chunked
prefill, MIXED batches); V3 with q-LoRA, sigmoid noaux_tc routing and yarn rope (mscale != mscale_all_dim).
"""

from __future__ import annotations

import pytest

from tests.frontends.native.hf_oracle import hf_greedy, random_prompts
from tests.frontends.sglang.helpers import NEW_TOKENS, generate, sglang_engine

pytestmark = pytest.mark.slow

CHECKPOINTS = {
    "v2": ("DeepseekV2ForCausalLM", dict(chunked_prefill_size=16, enable_mixed_chunk=True)),
    "v3": ("DeepseekV3ForCausalLM", {}),
}


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_deepseek_matches_transformers_with_radix_cache_hits(checkpoint_factory, prompts, name):
    from sglang.srt.models.registry import ModelRegistry

    arch, engine_args = CHECKPOINTS[name]
    model_cls, _ = ModelRegistry.resolve_model_cls([arch])
    assert model_cls.__module__.startswith("atom_frontends.sglang.models.")  # ours, not SGLang's
    path = checkpoint_factory(arch)
    followups = [p + tail for p, tail in zip(prompts[2:4], random_prompts([5, 11], seed=3))]
    with sglang_engine(path, attention_backend="atom", **engine_args) as engine:
        first = generate(engine, prompts)
        second = generate(engine, followups)
    assert [o["output_ids"] for o in first + second] == hf_greedy(path, prompts + followups, NEW_TOKENS)
    cached = [o["meta_info"]["cached_tokens"] for o in second]
    assert all(c >= len(p) for c, p in zip(cached, prompts[2:4])), cached
