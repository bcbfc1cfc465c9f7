"""Expert parallelism: the MoE layer with each rank holding only its experts (atom_core.layers.moe,
Platform.local_experts), rank by rank in one process against transformers' MoE block, and whole models on 2 CPU
processes (gloo, tests/core/test_tensor_parallel.py's host) against transformers' logits."""

from __future__ import annotations

import pytest
import torch

from atom_core.layers.moe import FusedExperts
from atom_core.layers.moe_router import route, router_config
from atom_core.models.weights import load_named_weights
from atom_core.platform import Platform
from tests.core.test_moe_layer import HIDDEN, INTER, QWEN3, _hf_forward, _hf_weights, _inputs, _per_expert, _qwen3_block
from tests.core.test_tensor_parallel import hf_logits, tp2_run

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("tp, ep, placement", [(2, 1, "linear"), (2, 2, "linear"), (2, 2, "round_robin"),
                                               (4, 2, "linear")])
@pytest.mark.parametrize("per_expert", [False, True], ids=["fused", "per-expert"])
def test_parallel_shards_sum_to_the_full_layer(tp, ep, placement, per_expert):
    """tp ranks' experts (ep > 1: each rank only its E / ep experts, each split over tp / ep ranks), their partial
    outputs summed as the host's all-reduce would, == transformers' block (up to float summation order)."""
    cfg, block = _qwen3_block(seed=6, **QWEN3["top2-norm"])
    x = _inputs(seed=7)
    weights = _hf_weights(block)
    topk_weights, topk_ids = route(x, dict(weights)["gate.weight"], router_config(cfg))
    experts = [(n, t) for n, t in (_per_expert(weights, cfg.num_experts) if per_expert else weights)
               if n.startswith("experts.")]
    partial, held = [], []
    for rank in range(tp):
        holder = torch.nn.Module()  # keeps the checkpoint's "experts." names
        platform = Platform("test", torch.device("cpu"), rank, tp, ep_rank=rank // (tp // ep), ep_size=ep,
                            expert_placement=placement)
        holder.experts = FusedExperts(cfg.num_experts, HIDDEN, INTER, platform=platform)
        load_named_weights(holder, experts, {})
        assert holder.experts.gate_up_proj.shape == (cfg.num_experts // ep, 2 * INTER * ep // tp, HIDDEN)
        held.append(holder.experts.local_experts)
        partial.append(holder.experts(x, topk_weights, topk_ids))
    torch.testing.assert_close(sum(partial), _hf_forward(block, x), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(partial[0], partial[-1])
    every = sorted(e for ids in held[::tp // ep] for e in ids)  # one rank of each EP group: every expert once
    assert every == list(range(cfg.num_experts))
    if (ep, placement) == (2, "round_robin"):
        assert held == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_expert_parallel_rank_skips_other_experts_and_names_bad_ids():
    """A rank never reads another rank's experts (NaN there changes nothing); an expert id past E still fails; the
    id mapping compiles with dynamo (fullgraph)."""
    cfg, block = _qwen3_block(seed=6, **QWEN3["top2-norm"])
    weights = _per_expert(_hf_weights(block), cfg.num_experts)
    holder = torch.nn.Module()
    holder.experts = FusedExperts(cfg.num_experts, HIDDEN, INTER,
                                  platform=Platform("test", torch.device("cpu"), 1, 2, ep_rank=1, ep_size=2))
    assert holder.experts.local_experts == [4, 5, 6, 7]
    assert holder.experts.expert_map.tolist() == [-1, -1, -1, -1, 0, 1, 2, 3]
    assert "experts.expert_map" not in holder.state_dict()  # not persistent: never looked for in a checkpoint
    poisoned = [(n, torch.full_like(t, float("nan")) if n.startswith(("experts.0.", "experts.3.")) else t)
                for n, t in weights if n.startswith("experts.")]
    load_named_weights(holder, poisoned, {})
    assert not holder.experts.gate_up_proj.isnan().any() and not holder.experts.down_proj.isnan().any()
    with pytest.raises(ValueError, match="checkpoint has expert 8, but the layer has 8 experts"):
        holder.experts.weight_loader(holder.experts.down_proj, torch.zeros(HIDDEN, INTER), (8, "down"))
    # hosts compile the decoder with dynamo (vLLM: fullgraph=True): the id mapping traces with the op
    x = _inputs(seed=7)
    topk_weights, topk_ids = route(x, dict(weights)["gate.weight"], router_config(cfg))
    compiled = torch.compile(holder.experts, fullgraph=True, backend="eager", dynamic=True)
    torch.testing.assert_close(compiled(x, topk_weights, topk_ids), holder.experts(x, topk_weights, topk_ids),
                               rtol=0, atol=0)


@pytest.mark.parametrize("fields, match", [
    (dict(ep_rank=2, ep_size=2), r"ep_rank=2 is outside \[0, ep_size=2\)"),
    (dict(tp_size=2, ep_size=4, ep_rank=0), "ep_size=4 must divide the MoE group's dp_size x tp_size = 2"),
    (dict(tp_rank=1, tp_size=2, ep_size=2, ep_rank=0), "ep_rank=0 does not match moe_rank=1"),
    (dict(tp_size=2, dp_rank=1, dp_size=2, ep_size=4, ep_rank=0, data_parallel_experts=FusedExperts.local_forward),
     "ep_rank=0 does not match moe_rank=2"),
    (dict(dp_rank=2, dp_size=2), r"dp_rank=2 is outside \[0, dp_size=2\)"),
    (dict(dp_rank=1, dp_size=2), "dp_size=2 needs the host's data_parallel_experts"),
    (dict(tp_size=2, ep_size=2, expert_placement="random"), "expert_placement='random'"),
])
def test_bad_expert_parallel_layouts_are_named(fields, match):
    with pytest.raises(ValueError, match=match):
        Platform("test", torch.device("cpu"), **fields)


def test_expert_placements_follow_vllm():
    """E % ep_size = r: the first r ranks hold one expert more (vLLM's determine_expert_map); too few experts fail."""
    def held(placement):
        return [Platform("t", torch.device("cpu"), r, 3, ep_rank=r, ep_size=3, expert_placement=placement)
                .local_experts(8) for r in range(3)]

    assert held("linear") == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert held("round_robin") == [[0, 3, 6], [1, 4, 7], [2, 5]]
    with pytest.raises(ValueError, match="ep_size=2 ranks needs at least as many experts, got num_experts=1"):
        Platform("test", torch.device("cpu"), 1, 2, ep_rank=1, ep_size=2).local_experts(1)


def test_ep2_models_match_transformers(checkpoint_factory, fp8_checkpoint):
    """2 ranks, each holding half the experts of every MoE layer, whole experts (vLLM's EP: no intermediate split):
    Qwen3-MoE (a dense layer, then MoE; linear placement), DeepSeek-V3 (MLA, 2 expert groups, a shared expert;
    round-robin placement) and an FP8 block Qwen3-MoE, in one pair of processes."""
    from tests.fp8_checkpoints import QWEN3_MOE, simulate_activation_quantization
    from tests.frontends.native.hf_oracle import hf_model

    qwen3 = checkpoint_factory("Qwen3MoeForCausalLM")
    deepseek = checkpoint_factory("DeepseekV3ForCausalLM")
    arch, overrides = QWEN3_MOE
    fp8, dequantized = fp8_checkpoint((arch, dict(overrides, intermediate_size=512, moe_intermediate_size=256)),
                                      "block")
    runs = tp2_run([(qwen3, 2, "linear"), (deepseek, 2, "round_robin"), (fp8, 2, "linear")])
    held = {"linear": [[4, 4, [0, 1, 2, 3]], [4, 4, [4, 5, 6, 7]]],
            "round_robin": [[4, 4, [0, 2, 4, 6]], [4, 4, [1, 3, 5, 7]]]}
    for (rank0, rank1), placement in zip(runs, ["linear", "round_robin", "linear"]):
        assert rank0["logits"] == rank1["logits"]
        assert [rank0["experts"], rank1["experts"]] == [[held[placement][0]], [held[placement][1]]]  # one MoE layer
    for (rank0, _), path in zip(runs, [qwen3, deepseek]):
        want = hf_logits(transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval())
        assert want.argmax(-1).unique().numel() > 3  # informative: the greedy token varies along the sequence
        torch.testing.assert_close(torch.tensor(rank0["logits"]), want, rtol=1e-4, atol=1e-4)
    # as test_tp2_fp8_logits_match_transformers: an fp8 rounding boundary may flip after another summation order
    want = hf_logits(simulate_activation_quantization(hf_model(dequantized), "block"))
    torch.testing.assert_close(torch.tensor(runs[2][0]["logits"]), want, rtol=1e-2, atol=5e-2)
