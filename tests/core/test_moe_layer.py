"""The MoE layer (atom_core.layers.moe) against transformers' own MoE blocks on the same random weights, float32:
Qwen3MoeSparseMoeBlock (softmax top-k, norm_topk_prob on/off), DeepseekV2Moe (greedy, group_limited_greedy,
shared experts, routed_scaling_factor) and DeepseekV3MoE (sigmoid + noaux_tc with a random correction bias,
n_group/topk_group). Outputs must be bitwise equal. Each router feature is also shown to matter (switching it off
changes transformers' output), so a layer ignoring it would fail. Weights load under the names transformers'
state dict has (per-expert in 4.x, fused gate_up_proj/down_proj in 5.x) and as per-expert tensors too."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from atom_core.layers.moe import FusedExperts, MoE
from atom_core.layers.moe_router import RouterConfig, route, router_config
from atom_core.models.llama import LlamaMLP
from atom_core.models.weights import load_named_weights
from atom_core.platform import Platform
from atom_frontends.native.hooks import NATIVE

transformers = pytest.importorskip("transformers")

HIDDEN, INTER = 32, 16
SHARED_PACKED = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

QWEN3 = {  # name → Qwen3MoeConfig overrides
    "top2-norm": dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True),
    "top3-raw": dict(num_experts=8, num_experts_per_tok=3, norm_topk_prob=False),
    "top8-of-16-norm": dict(num_experts=16, num_experts_per_tok=8, norm_topk_prob=True),
}
DEEPSEEK = {  # name → (architecture, config overrides)
    "v2-greedy": ("DeepseekV2", dict(topk_method="greedy", num_experts_per_tok=3, n_shared_experts=2,
                                     routed_scaling_factor=2.5)),
    "v2-group-limited": ("DeepseekV2", dict(topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                            num_experts_per_tok=3, n_shared_experts=1, routed_scaling_factor=1.5)),
    "v3-noaux-norm": ("DeepseekV3", dict(n_group=4, topk_group=2, num_experts_per_tok=4, norm_topk_prob=True,
                                         routed_scaling_factor=2.5)),
    "v3-noaux-raw-1group": ("DeepseekV3", dict(n_group=1, topk_group=1, num_experts_per_tok=2,
                                               norm_topk_prob=False, n_shared_experts=2)),
}


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Wide random weights everywhere (transformers' router starts at zeros) and a correction bias of the
    scores' scale, so it changes which experts win."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        for name, b in module.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)


def _hf_forward(block, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = block(x[None])
    return (out[0] if isinstance(out, tuple) else out)[0]  # 4.x returns (hidden, router_logits)


def _tolerance(block) -> dict:
    """Bitwise where transformers stacks its experts as we do (5.x); transformers 4.x runs gate and up as two
    GEMMs per expert (ours: one), which may change the last bits."""
    return dict(rtol=0, atol=0) if hasattr(block.experts, "gate_up_proj") else dict(rtol=1e-5, atol=1e-6)


def _hf_weights(block) -> list[tuple[str, torch.Tensor]]:
    return [(n, t.detach().clone()) for n, t in block.state_dict().items()]


def _qwen3_block(seed: int, **overrides):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = transformers.Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTER, **overrides)
    block = Qwen3MoeSparseMoeBlock(cfg).float().eval()
    _randomize(block, seed)
    return cfg, block


def _deepseek_block(arch: str, seed: int, **overrides):
    import importlib

    package = {"DeepseekV2": "deepseek_v2", "DeepseekV3": "deepseek_v3"}[arch]
    module = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    config_cls = getattr(transformers, f"{arch}Config")
    fields = dict(hidden_size=HIDDEN, intermediate_size=64, moe_intermediate_size=INTER, n_routed_experts=16,
                  n_shared_experts=1, norm_topk_prob=False)
    cfg = config_cls(**{**fields, **overrides})
    block_cls = getattr(module, f"{arch}MoE", None) or module.DeepseekV2Moe  # transformers 5 renamed V2's
    block = block_cls(cfg).float().eval()
    _randomize(block, seed)
    return cfg, block


def _ours(cfg, rc: RouterConfig | None = None, shared: bool = False) -> MoE:
    rc = rc or router_config(cfg)
    shared_experts = LlamaMLP(cfg, INTER * cfg.n_shared_experts) if shared else None
    return MoE(HIDDEN, INTER, rc, cfg.hidden_act, shared_experts).float().eval()


def _load(layer: MoE, weights) -> None:
    loaded = load_named_weights(layer, weights, SHARED_PACKED)
    assert loaded == set(dict(layer.named_parameters()))


def _inputs(tokens: int = 37, seed: int = 0) -> torch.Tensor:
    return torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(QWEN3))
def test_qwen3_moe_block(name):
    cfg, block = _qwen3_block(seed=1, **QWEN3[name])
    x = _inputs()
    with NATIVE.scope():
        ours = _ours(cfg)
    _load(ours, _hf_weights(block))
    expected = _hf_forward(block, x)
    torch.testing.assert_close(ours(x), expected, **_tolerance(block))
    # renormalisation matters here: transformers' block with it flipped, same weights, gives another output
    flipped = transformers.Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTER,
                                          **{**QWEN3[name], "norm_topk_prob": not cfg.norm_topk_prob})
    twin = type(block)(flipped).float().eval()
    twin.load_state_dict(block.state_dict())
    assert not torch.equal(_hf_forward(twin, x), expected)


@pytest.mark.parametrize("name", list(DEEPSEEK))
def test_deepseek_moe_block(name):
    arch, overrides = DEEPSEEK[name]
    cfg, block = _deepseek_block(arch, seed=2, **overrides)
    rc = router_config(cfg)
    assert rc.topk_method == overrides.get("topk_method", "noaux_tc")
    x = _inputs(seed=3)
    with NATIVE.scope():
        ours = _ours(cfg, shared=True)
    _load(ours, _hf_weights(block))
    # the shared experts' GEMMs have other shapes than transformers' (gate and up in one), so the last bits
    # may differ; with their output zeroed in both, the routed experts must match bitwise
    torch.testing.assert_close(ours(x), _hf_forward(block, x), rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        ours.shared_experts.down_proj.weight.zero_()
        block.shared_experts.down_proj.weight.zero_()
    torch.testing.assert_close(ours(x), _hf_forward(block, x), **_tolerance(block))


@pytest.mark.parametrize("name", [n for n in DEEPSEEK if "greedy" not in n])
def test_deepseek_router_features_matter(name):
    """Ignoring the groups or the correction bias changes which experts win for these inputs: the exact match
    above would catch a layer that did."""
    arch, overrides = DEEPSEEK[name]
    cfg, block = _deepseek_block(arch, seed=2, **overrides)
    rc = router_config(cfg)
    x = _inputs(seed=3)
    weight = block.gate.weight.detach()
    bias = getattr(block.gate, "e_score_correction_bias", None)
    chosen = route(x, weight, rc, bias)[1].sort(-1)[0]
    if rc.n_group > 1:
        ungrouped = route(x, weight, dataclasses.replace(rc, n_group=1, topk_group=1), bias)[1]
        assert not torch.equal(chosen, ungrouped.sort(-1)[0])
    if bias is not None:
        assert not torch.equal(chosen, route(x, weight, rc, torch.zeros_like(bias))[1].sort(-1)[0])


@pytest.mark.parametrize("name", ["v2-group-limited", "v3-noaux-norm"])
def test_deepseek_router_weight_stays_float32_in_a_bf16_model(name):
    """transformers keeps DeepSeek's router weight in float32 in a bfloat16 model (_keep_in_fp32_modules_strict)
    and routes with it: a layer built in bfloat16 (as the loader builds it) must route bitwise as transformers
    does, not from a bf16-rounded copy of the checkpoint's weight."""
    arch, overrides = DEEPSEEK[name]
    cfg, block = _deepseek_block(arch, seed=2, **overrides)
    x = _inputs(seed=3).bfloat16()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with NATIVE.scope():
            ours = MoE(HIDDEN, INTER, router_config(cfg), cfg.hidden_act)
    finally:
        torch.set_default_dtype(default)
    _load(ours, [(n, t) for n, t in _hf_weights(block) if not n.startswith("shared_experts.")])
    with torch.no_grad():  # 5.x returns (logits, weights, ids), 4.x (ids, weights) or (weights, ids)
        routed = block.gate(x[None])
    want_ids = next(t for t in routed if not t.is_floating_point())
    want_weights = routed[-1] if routed[-1].is_floating_point() else routed[-2]
    got_weights, got_ids = ours.gate(x)

    def by_expert(weights, ids):  # the k choices' order is topk's (unsorted): compare them by expert id
        ids, order = ids.sort(-1)
        return ids, weights.gather(1, order)

    got, want = by_expert(got_weights, got_ids), by_expert(want_weights, want_ids)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1], want[1])


def _per_expert(weights, num_experts: int) -> list[tuple[str, torch.Tensor]]:
    """transformers 5's fused expert tensors split as save_pretrained writes them (4.x's names already are)."""
    fused = dict(weights)
    if "experts.gate_up_proj" not in fused:
        return list(weights)
    gate_up, down = fused.pop("experts.gate_up_proj"), fused.pop("experts.down_proj")
    weights = list(fused.items())
    for i in range(num_experts):
        gate, up = gate_up[i].chunk(2, dim=0)
        weights += [(f"experts.{i}.gate_proj.weight", gate), (f"experts.{i}.up_proj.weight", up),
                    (f"experts.{i}.down_proj.weight", down[i])]
    return weights


def test_per_expert_checkpoint_names_load():
    """transformers' save_pretrained names (experts.{i}.gate_proj.weight ...) into the stacked parameters."""
    cfg, block = _qwen3_block(seed=4, **QWEN3["top3-raw"])
    with NATIVE.scope():
        ours = _ours(cfg)
    _load(ours, _per_expert(_hf_weights(block), cfg.num_experts))
    x = _inputs(seed=5)
    torch.testing.assert_close(ours(x), _hf_forward(block, x), **_tolerance(block))


def test_layer_compiles_with_dynamo_fullgraph():
    """Hosts compile the decoder with dynamo (vLLM: fullgraph=True): the experts are one opaque op there."""
    cfg, block = _deepseek_block("DeepseekV3", seed=8, **DEEPSEEK["v3-noaux-norm"][1])
    with NATIVE.scope():
        ours = _ours(cfg, shared=True)
    _load(ours, _hf_weights(block))
    x = _inputs(seed=9)
    compiled = torch.compile(ours, fullgraph=True, backend="eager", dynamic=True)
    torch.testing.assert_close(compiled(x), ours(x), rtol=0, atol=0)


@pytest.mark.parametrize("bad,match", [
    (dict(scoring="tanh"), "scoring_func='tanh'"),
    (dict(topk_method="noaux"), "topk_method='noaux'"),
    (dict(top_k=9), r"num_experts_per_tok=9 must lie in \[1, num_experts=8\]"),
    (dict(topk_method="noaux_tc", n_group=3), "n_group=3 must divide num_experts=8"),
    (dict(topk_method="group_limited_greedy", n_group=4, topk_group=5), "topk_group=5"),
    (dict(topk_method="noaux_tc", n_group=4, topk_group=1, top_k=3), "exceeds the experts"),
])
def test_bad_router_configs_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        RouterConfig(**{"num_experts": 8, "top_k": 2, **bad})


def test_unknown_model_type_and_bad_expert_weights_are_named():
    with pytest.raises(ValueError, match="no MoE router known for model_type='llama'"):
        router_config(transformers.LlamaConfig())
    experts = FusedExperts(4, HIDDEN, INTER, platform=Platform("test", torch.device("cpu")))
    with pytest.raises(ValueError, match="checkpoint has expert 4, but the layer has 4 experts"):
        experts.weight_loader(experts.down_proj, torch.zeros(HIDDEN, INTER), (4, "down"))
    with pytest.raises(ValueError, match="weight shape mismatch for experts.1.gate_proj"):
        experts.weight_loader(experts.gate_up_proj, torch.zeros(INTER, HIDDEN + 1), (1, "gate"))
    with pytest.raises(ValueError, match=r"mismatch for experts.2.down_proj: checkpoint \(32, 17\)"):
        experts.weight_loader(experts.down_proj, torch.zeros(HIDDEN, INTER + 1), (2, "down"))
    with pytest.raises(ValueError, match="mismatch for experts.gate_up_proj"):
        experts.weight_loader(experts.gate_up_proj, torch.zeros(4, 2 * INTER + 2, HIDDEN))
