"""Qwen3-MoE on the native engine: greedy tokens == transformers `generate` on the same saved checkpoints.

The checkpoints vary what the MoE layer does (top-k 2, 3 and 4 of 8 or 16 experts, norm_topk_prob on and off,
tied and untied embeddings, dense layers between MoE ones by `mlp_only_layers` and by `decoder_sparse_step`);
test_parity.py's scenarios run on them (batched prompts of different lengths, prefix-cache hits, chunked prefill,
preemption, the unfused Qwen3 prologue). The canary: with fused_moe (or any op every model runs) broken on
purpose, the MoE parity fails.
"""

from __future__ import annotations

import pytest

from tests.broken_ops import BREAKS, MOE_BREAKS, broken
from tests.frontends.native import test_parity as scenarios

MOE = "Qwen3MoeForCausalLM"
# name → (architecture, overrides of build_checkpoint's tiny Qwen3-MoE: 8 experts, top-2, norm_topk_prob,
# untied, layer 0 dense, 2 layers)
CHECKPOINTS = {
    "top2-norm-untied-dense0": (MOE, {}),
    "top3-raw-tied-dense-middle": (MOE, dict(num_experts_per_tok=3, norm_topk_prob=False, tie_word_embeddings=True,
                                             num_hidden_layers=3, mlp_only_layers=[1])),
    "top4-of-16-sparse-step2": (MOE, dict(num_experts=16, num_experts_per_tok=4, decoder_sparse_step=2,
                                          mlp_only_layers=[], num_hidden_layers=3)),
}
# (preemption_with_prefix_cache left out: ~14 s, and its parts run here already)
SCENARIOS = {f.__name__: f for f in (scenarios.prefix_cache, scenarios.chunked_prefill, scenarios.preemption,
                                     scenarios.unfused_prologue)}
# seed 1: with seed 0, transformers 4.56 (whose init draws other weights) gives one degenerate reference
SCENARIO_CHECKPOINT = (MOE, dict(seed=1))


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_greedy_matches_transformers(checkpoint_factory, name):
    ours, want = scenarios.plain(checkpoint_factory, CHECKPOINTS[name])
    assert ours == want


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_matches_transformers(checkpoint_factory, scenario):
    ours, want = SCENARIOS[scenario](checkpoint_factory, SCENARIO_CHECKPOINT)
    assert ours == want


def test_layers_are_moe_where_the_config_says(checkpoint_factory):
    """transformers' own model, loaded from the checkpoints, puts its MoE blocks where ours does."""
    from transformers import AutoModelForCausalLM

    from atom_core.layers.moe import MoE
    from atom_frontends.native import LLM

    for name in ("top3-raw-tied-dense-middle", "top4-of-16-sparse-step2"):
        arch, overrides = CHECKPOINTS[name]
        path = checkpoint_factory(arch, **overrides)
        hf = AutoModelForCausalLM.from_pretrained(str(path))
        want = [hasattr(layer.mlp, "gate") for layer in hf.model.layers]
        ours = [isinstance(layer.mlp, MoE) for layer in LLM(path).engine.model.model.layers]
        assert ours == want and any(want) and not all(want), (name, ours, want)


@pytest.mark.parametrize("op", sorted({**BREAKS, **MOE_BREAKS}))
def test_moe_parity_catches_a_broken_op(checkpoint_factory, op):
    with broken(op):
        ours, want = scenarios.plain(checkpoint_factory, CHECKPOINTS["top3-raw-tied-dense-middle"])
    assert ours != want, f"the MoE parity check still passes with {op} broken"
