"""Qwen3-MoE in a real sglang.Engine on CPU (atom-core's model through SGLANG_EXTERNAL_MODEL_PACKAGE, our
attention backend): greedy tokens == transformers, prompts of several lengths in one batch, then prompts
extending cached ones (radix-cache hits). SGLang's own Qwen3-MoE does not run on a CPU-only machine (its rope
imports vLLM's op), so transformers is the oracle. The checkpoint mixes a dense layer with top-3 MoE layers."""

from __future__ import annotations

import pytest

from tests.frontends.native.hf_oracle import hf_greedy, random_prompts
from tests.frontends.sglang.helpers import NEW_TOKENS, generate, sglang_engine

pytestmark = pytest.mark.slow

CHECKPOINT = ("Qwen3MoeForCausalLM", dict(num_experts_per_tok=3, num_hidden_layers=3, mlp_only_layers=[1]))


def test_qwen3_moe_matches_transformers(checkpoint_factory, prompts):
    from sglang.srt.models.registry import ModelRegistry

    model_cls, _ = ModelRegistry.resolve_model_cls([CHECKPOINT[0]])
    assert model_cls.__module__ == "atom_frontends.sglang.models.entry"  # ours, not SGLang's
    path = checkpoint_factory(CHECKPOINT[0], **CHECKPOINT[1])
    followups = [p + tail for p, tail in zip(prompts[2:4], random_prompts([5, 11], seed=3))]
    with sglang_engine(path, attention_backend="atom") as engine:
        first = generate(engine, prompts)
        second = generate(engine, followups)
    assert [o["output_ids"] for o in first + second] == hf_greedy(path, prompts + followups, NEW_TOKENS)
    cached = [o["meta_info"]["cached_tokens"] for o in second]
    assert all(c >= len(p) for c, p in zip(cached, prompts[2:4])), cached
