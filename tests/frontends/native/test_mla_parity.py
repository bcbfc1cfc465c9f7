"""DeepSeek-V2/V3 (MLA + MoE) on the native engine: greedy tokens == transformers `generate` on the same saved
checkpoints.

Checkpoints (build_checkpoint's tiny V2 / V3, 2 layers: dense, then MoE + a shared expert): V2 without q-LoRA,
softmax `greedy` and `group_limited_greedy` routing; V3 with q-LoRA, sigmoid `noaux_tc` (random correction bias)
and yarn rope (mscale != mscale_all_dim); V3 with the real 512 + 64 latent; V3 with rope_interleave off; V3
without shared experts.
test_parity.py's scenarios run on V2 and V3 (batched prompts of different lengths, prefix-cache hits, chunked
prefill, preemption). The canary: with the latent-cache write, MLA attention, rotary or the experts broken on
purpose, the parity fails; so does it with the interleaved rope or the yarn softmax-scale correction left out.
"""

from __future__ import annotations

import pytest

from tests.broken_ops import MLA_BREAKS, MOE_BREAKS, broken
from tests.frontends.native import test_parity as scenarios

V2, V3 = "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"
CHECKPOINTS = {
    "v2-greedy": (V2, {}),
    "v2-group-limited": (V2, dict(topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                  num_experts_per_tok=3, routed_scaling_factor=1.5)),
    "v3-qlora-noaux-yarn": (V3, {}),
    "v3-latent-512+64": (V3, dict(kv_lora_rank=512, qk_rope_head_dim=64)),
    "v3-rope-not-interleaved": (V3, dict(rope_interleave=False)),
    # n_shared_experts=0: transformers builds 0-wide shared experts and saves their empty weights
    "v3-no-shared-experts": (V3, dict(n_shared_experts=0)),
}
SCENARIOS = {f.__name__: f for f in (scenarios.prefix_cache, scenarios.chunked_prefill, scenarios.preemption)}
CANARY = {**MLA_BREAKS, **MOE_BREAKS, "rotary": None}


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_greedy_matches_transformers(checkpoint_factory, name):
    ours, want = scenarios.plain(checkpoint_factory, CHECKPOINTS[name])
    assert ours == want


@pytest.mark.parametrize("checkpoint", ["v2-greedy", "v3-qlora-noaux-yarn"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_matches_transformers(checkpoint_factory, scenario, checkpoint):
    ours, want = SCENARIOS[scenario](checkpoint_factory, CHECKPOINTS[checkpoint])
    assert ours == want


def test_latent_cache_is_one_row_per_token(checkpoint_factory):
    """Each MLA layer's cache holds kv_lora_rank + qk_rope_head_dim features per token, and the engine sizes
    its blocks by that (not by 2 * heads * head_dim)."""
    from atom_frontends.native import LLM
    from atom_frontends.native.attention import NativeMLAAttention

    arch, overrides = CHECKPOINTS["v3-latent-512+64"]
    runner = LLM(checkpoint_factory(arch, **overrides), block_size=8, num_kv_blocks=10, max_model_len=64).engine.runner
    assert [type(a) for a in runner.attn_layers] == [NativeMLAAttention] * 2
    assert [tuple(a.kv_cache.shape) for a in runner.attn_layers] == [(10, 8, 576)] * 2
    assert runner.bytes_per_block() == 2 * 8 * 576 * 4


@pytest.mark.parametrize("op", sorted(CANARY))
def test_mla_parity_catches_a_broken_op(checkpoint_factory, op):
    with broken(op):
        ours, want = scenarios.plain(checkpoint_factory, CHECKPOINTS["v3-qlora-noaux-yarn"])
    assert ours != want, f"the MLA parity check still passes with {op} broken"


@pytest.mark.parametrize("broken_part", ["interleave", "yarn_softmax_scale"])
def test_mla_parity_catches_missing_rope_details(checkpoint_factory, monkeypatch, broken_part):
    """The V3 checkpoint exercises both: a layer skipping either gives other tokens."""
    from atom_core.layers import mla

    if broken_part == "interleave":
        monkeypatch.setattr(mla, "_deinterleave", lambda x: x)
    else:
        monkeypatch.setattr(mla, "mla_softmax_scale",
                            lambda cfg: (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5)
    ours, want = scenarios.plain(checkpoint_factory, CHECKPOINTS["v3-qlora-noaux-yarn"])
    assert ours != want
