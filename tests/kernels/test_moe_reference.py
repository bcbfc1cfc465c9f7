"""The fused_moe torch reference against transformers' own MoE experts (Qwen3-MoE) on the same weights."""

from __future__ import annotations

import pytest
import torch

from atom_kernels.reference import fp8_fused_moe, fp8_quantize, fused_moe

transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_moe import modeling_qwen3_moe as qm  # noqa: E402


def _experts(num_experts: int, hidden: int, inter: int, dtype: torch.dtype, seed: int):
    cfg = transformers.Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=num_experts,
                                      num_experts_per_tok=2)
    torch.manual_seed(seed)
    block = qm.Qwen3MoeSparseMoeBlock(cfg).to(dtype)
    experts = block.experts
    if hasattr(experts, "gate_up_proj"):  # transformers >= 5: stacked [E, 2I, H] / [E, H, I]
        with torch.no_grad():
            experts.gate_up_proj.normal_(0, 0.2)
            experts.down_proj.normal_(0, 0.2)
        return experts, experts.gate_up_proj.detach(), experts.down_proj.detach()
    pytest.skip("transformers < 5 keeps per-expert modules; the layer tests cover that layout")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,num_experts,top_k", [(1, 4, 1), (7, 8, 2), (33, 16, 3), (64, 8, 8)])
def test_matches_transformers_experts(tokens, num_experts, top_k, dtype):
    experts, w13, w2 = _experts(num_experts, 32, 24, dtype, seed=tokens)
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 32, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=g).to(dtype)
    with torch.no_grad():
        expected = experts(x, ids, weights)
    got = fused_moe(x, w13, w2, weights, ids)
    assert got.dtype == dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_unused_expert_and_empty_batch():
    _, w13, w2 = _experts(4, 16, 8, torch.float32, seed=0)
    x = torch.randn(3, 16)
    ids = torch.tensor([[1], [1], [1]])
    out = fused_moe(x, w13, w2, torch.ones(3, 1), ids)
    gate, up = (x @ w13[1].T).chunk(2, dim=-1)
    torch.testing.assert_close(out, (torch.nn.functional.silu(gate) * up) @ w2[1].T)
    assert fused_moe(x[:0], w13, w2, torch.ones(0, 1), ids[:0]).shape == (0, 16)


def test_minus_one_ids_are_skipped():
    """Expert parallelism: -1 marks a pair whose expert is on another rank; it adds nothing. Against a plain loop
    over the pairs; a token whose pairs are all remote gets zeros."""
    g = torch.Generator().manual_seed(0)
    t, k, e, h, i = 9, 3, 6, 16, 8
    x = torch.randn(t, h, generator=g)
    w13, w2 = torch.randn(e, 2 * i, h, generator=g) / h**0.5, torch.randn(e, h, i, generator=g) / i**0.5
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    ids[::2, 1] = -1
    ids[3] = -1
    weights = torch.rand(t, k, generator=g)
    want = torch.zeros(t, h)
    for tok in range(t):
        for j in range(k):
            if ids[tok, j] >= 0:
                gate, up = (w13[ids[tok, j]] @ x[tok]).chunk(2)
                want[tok] += weights[tok, j] * (w2[ids[tok, j]] @ (torch.nn.functional.silu(gate) * up))
    got = fused_moe(x, w13, w2, weights, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[3], torch.zeros(h)) and not torch.allclose(got, fused_moe(x, w13, w2, weights, ids.abs()))
    # the fp8 experts share the skipping: a -1 pair adds what a pair of routing weight 0 adds (up to float32
    # rounding: the weight-0 pairs join expert 0's batch, and the CPU GEMM may block a larger batch otherwise)
    (q13, s13), (q2, s2) = fp8_quantize(w13, h), fp8_quantize(w2, i)  # per output channel: scales [E, N, 1]
    fp8 = (q13, q2, s13, s2)
    got = fp8_fused_moe(x, *fp8, weights, ids, h, 0)
    torch.testing.assert_close(got, fp8_fused_moe(x, *fp8, weights * (ids >= 0), ids.clamp(min=0), h, 0),
                               rtol=1e-5, atol=1e-6)
    assert torch.equal(got[3], torch.zeros(h))


@pytest.mark.parametrize("bad,match", [
    (dict(ids=torch.tensor([[4]])), r"topk_ids must lie in \[0, 4\)"),
    (dict(ids=torch.tensor([[-2]])), r"or be -1 for an expert of another rank.*got -2"),
    (dict(ids=torch.tensor([[0.0]])), "topk_ids must be int"),
    (dict(w2=torch.zeros(4, 16, 9)), "w2 must be"),
    (dict(weights=torch.ones(1, 2)), "topk_weights must be"),
])
def test_bad_arguments_are_named(bad, match):
    _, w13, w2 = _experts(4, 16, 8, torch.float32, seed=0)
    args = dict(x=torch.randn(1, 16), w13=w13, w2=w2, weights=torch.ones(1, 1), ids=torch.tensor([[0]]))
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        fused_moe(args["x"], args["w13"], args["w2"], args["weights"], args["ids"])
