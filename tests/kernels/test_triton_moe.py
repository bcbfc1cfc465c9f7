"""Triton fused_moe and moe_align vs the torch reference / a torch version of moe_align's contract.

GPU tests (marked gpu) run the compiled kernels on CUDA; test_kernels_under_the_interpreter runs the same
checks on CPU tensors through Triton's interpreter in a subprocess (fp32 and fp16 only: the interpreter of
triton 3.6 multiplies bf16 tiles as raw int16 bits).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from atom_kernels import reference as ref  # noqa: E402  (after the triton skip)
from atom_kernels.triton.moe import fused_moe, moe_config  # noqa: E402
from atom_kernels.triton.moe.align import max_blocks, moe_align  # noqa: E402
from tests.interpreter import run_under_interpreter  # noqa: E402
from tests.kernels.test_triton_attention import ids as dtype_ids  # noqa: E402

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
# Outputs are O(1) (std ~1, max ~5). bf16/fp16: the reference rounds every partial sum over top-k to the dtype,
# we add in fp32 and round once, and a GEMM's different reduction order can flip the rounding of gate/up.
TOL = {F32: dict(rtol=1e-4, atol=1e-4), BF16: dict(rtol=3e-2, atol=3e-2), F16: dict(rtol=8e-3, atol=8e-3)}


def align_reference(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """moe_align's contract in plain torch: (rows in use, expert of each block), pairs i = t * K + k."""
    flat = topk_ids.reshape(-1).cpu()
    rows: list[int] = []
    experts: list[int] = []
    for e in range(num_experts):
        pairs = (flat == e).nonzero().flatten().tolist()  # increasing pair order
        if pairs:
            padded = -(-len(pairs) // block_m) * block_m
            rows += pairs + [flat.numel()] * (padded - len(pairs))
            experts += [e] * (padded // block_m)
    return rows, experts


def check_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> None:
    sorted_ids, expert_ids, post_pad = moe_align(topk_ids, num_experts, block_m)
    rows, experts = align_reference(topk_ids, num_experts, block_m)
    assert post_pad.device == topk_ids.device and post_pad.tolist() == [len(rows)]
    assert len(rows) <= sorted_ids.numel() == max_blocks(topk_ids.numel(), num_experts, block_m) * block_m
    assert sorted_ids[: len(rows)].tolist() == rows
    assert expert_ids[: len(experts)].tolist() == experts


def moe_inputs(t, k, e, h, i, dtype, seed, device, routing=None):
    """x [t, h], weights scaled so every stage is O(1), softmax-like routing weights; routing [t, k] or random
    distinct experts per token."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * i, h, generator=g) / h**0.5
    w2 = torch.randn(e, h, i, generator=g) / i**0.5
    if routing is None:
        routing = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    weights = torch.rand(t, k, generator=g)
    return [a.to(device=device, dtype=dtype) for a in (x, w13, w2)] + [weights.to(device), routing.to(device)]


def check_moe(t, k, e, h, i, dtype, device, seed=0, routing=None, config=None) -> None:
    x, w13, w2, weights, routing = moe_inputs(t, k, e, h, i, dtype, seed, device, routing)
    got = fused_moe(x, w13, w2, weights, routing, config=config)
    want = ref.fused_moe(*(a.cpu() for a in (x, w13, w2, weights, routing)))
    assert got.dtype == dtype and got.shape == (t, h)
    torch.testing.assert_close(got.cpu(), want, **TOL[dtype])


def one_expert_routing(t, k, e, hot, seed):
    """Every token picks expert `hot` (column 0) plus k - 1 distinct others."""
    g = torch.Generator().manual_seed(seed)
    others = [torch.tensor([x for x in torch.randperm(e, generator=g).tolist() if x != hot][: k - 1], dtype=torch.long)
              for _ in range(t)]  # (an empty tensor would be float: k = 1)
    return torch.stack([torch.cat([torch.tensor([hot]), o]) for o in others])


def unused_expert_routing(t, k, e, unused, seed):
    g = torch.Generator().manual_seed(seed)
    pool = torch.tensor([x for x in range(e) if x not in unused])
    return torch.stack([pool[torch.randperm(len(pool), generator=g)[:k]] for _ in range(t)])


def remote_expert_routing(t, k, e, seed):
    """Rank 0's routing under expert parallelism over 2 ranks: distinct ids of 2e global experts, mapped to local
    ids, -1 for the other rank's half (some tokens have all their pairs remote)."""
    g = torch.Generator().manual_seed(seed)
    routing = torch.stack([torch.randperm(2 * e, generator=g)[:k] for _ in range(t)])
    return torch.where(routing < e, routing, -1)


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=dtype_ids)
@pytest.mark.parametrize("t, k, e", [(1, 1, 8), (1, 8, 128), (3, 2, 8), (17, 8, 64), (257, 8, 128), (257, 2, 8),
                                     (33, 8, 8), (1000, 1, 16)])
def test_matches_reference(t, k, e, dtype):
    check_moe(t, k, e, 256, 96, dtype, "cuda", seed=t + k + e)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_ids)
def test_qwen3_moe_expert_shapes(dtype):
    """Hidden 2048, expert intermediate 768 (Qwen3-30B-A3B), 16 experts, top-8."""
    check_moe(33, 8, 16, 2048, 768, dtype, "cuda", seed=1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_ids)
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_every_tile_config(t, dtype):
    """Each tile config (decode to prefill) on the same inputs, whatever T would pick; H, I not multiples of
    the tiles."""
    for tokens in (1, 64, 256, 4096):
        cfg = moe_config(tokens, 8, 64, dtype)
        check_moe(t, 8, 64, 200, 72, dtype, "cuda", seed=2, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_ids)
@pytest.mark.parametrize("t, k", [(300, 1), (257, 2), (64, 8)])
def test_all_tokens_to_one_expert(t, k, dtype):
    check_moe(t, k, 16, 128, 64, dtype, "cuda", routing=one_expert_routing(t, k, 16, hot=5, seed=t))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_ids)
def test_experts_no_token_picks(dtype):
    check_moe(129, 2, 16, 128, 64, dtype, "cuda", routing=unused_expert_routing(129, 2, 16, {0, 7, 15}, seed=3))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_ids)
@pytest.mark.parametrize("t", [1, 3, 257])
def test_remote_experts_are_dropped(t, dtype):
    """-1 ids (experts of another rank) add nothing, as the reference skips them; the GEMVs (t 1, 3) and blocks."""
    check_moe(t, 4, 16, 128, 64, dtype, "cuda", routing=remote_expert_routing(t, 4, 16, seed=t))


@pytest.mark.gpu
@pytest.mark.parametrize("t, k, e, block_m", [(1, 8, 128, 16), (3, 2, 8, 16), (64, 8, 128, 16), (257, 8, 128, 32),
                                              (4096, 8, 128, 128), (1000, 1, 8, 64), (130, 4, 512, 16)])
def test_moe_align_matches_its_contract(t, k, e, block_m):
    g = torch.Generator().manual_seed(t)
    topk_ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    for ids_dtype in (torch.int64, torch.int32):
        check_align(topk_ids.to("cuda", ids_dtype), e, block_m)
    check_align(one_expert_routing(t, k, e, hot=e - 1, seed=t).cuda(), e, block_m)


@pytest.mark.gpu
def test_moe_align_drops_out_of_range_ids():
    topk_ids = torch.tensor([[0, 8], [-1, 3], [3, 0]], device="cuda")
    check_align(topk_ids, 8, 16)  # the reference keeps only ids in [0, 8)
    assert align_reference(topk_ids, 8, 16)[0][:3] == [0, 5, 6]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_ids)
@pytest.mark.parametrize("t", [37, 2], ids=["blocks", "gemv"])
def test_cuda_graph_replay_with_other_routing(t, dtype):
    """Captured once; replayed after new routing (other experts, other padded row count) is copied in."""
    k, e, h, i = 4, 32, 256, 96
    x, w13, w2, weights, routing = moe_inputs(t, k, e, h, i, dtype, 4, "cuda")
    fused_moe(x, w13, w2, weights, routing)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, weights, routing)
    for new_routing in (one_expert_routing(t, k, e, hot=9, seed=5), unused_expert_routing(t, k, e, {1, 2}, seed=6)):
        routing.copy_(new_routing)
        weights.copy_(torch.rand(t, k, generator=torch.Generator().manual_seed(7)))
        x.normal_()
        graph.replay()
        want = ref.fused_moe(*(a.cpu() for a in (x, w13, w2, weights, routing)))
        torch.testing.assert_close(out.cpu(), want, **TOL[dtype])


@pytest.mark.gpu
def test_inputs_on_two_devices_are_refused():
    x, w13, w2, weights, routing = moe_inputs(2, 1, 4, 32, 16, F32, 0, "cuda")
    with pytest.raises(ValueError, match="different devices"):
        fused_moe(x, w13, w2, weights.cpu(), routing)


# ---------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("bad, match", [
    (dict(w2=lambda w: w.to(F16)), "must have hidden's dtype"),
    (dict(x=lambda x: x.to(torch.int32)), "dtype torch.int32 not supported"),
    (dict(x=lambda x: x.t().contiguous().t()), "contiguous last dim"),
    (dict(routing=lambda r: r.t().contiguous().t()), "must be contiguous"),
    (dict(routing=lambda r: r[:, :1]), "topk_weights must be"),
])
def test_bad_arguments_are_named(bad, match):
    """Refused at launch time, before any kernel runs (so on CPU too)."""
    args = dict(zip(("x", "w13", "w2", "weights", "routing"), moe_inputs(4, 2, 4, 32, 16, F32, 0, "cpu")))
    for name, change in bad.items():
        args[name] = change(args[name])
    with pytest.raises(ValueError, match=match):
        fused_moe(*args.values())


def interpreter_checks() -> None:
    """The GPU tests' checks at tiny shapes on CPU tensors (run with TRITON_INTERPRET=1)."""
    # one-program align (up to 4 chunks of 128 pairs) and the three-kernel one, and both sides of the switch
    for t, k, e, bm in [(1, 8, 128, 16), (3, 2, 8, 16), (300, 2, 4, 32), (17, 8, 64, 64), (64, 8, 128, 16),
                        (65, 8, 16, 16)]:
        g = torch.Generator().manual_seed(t)
        check_align(torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]), e, bm)
    check_align(torch.tensor([[0, 8], [-1, 3], [3, 0]]), 8, 16)
    for dtype in (F32, F16):
        check_moe(1, 2, 8, 32, 24, dtype, "cpu")
        check_moe(17, 8, 16, 48, 40, dtype, "cpu", seed=1)  # H, I not multiples of any tile
        check_moe(40, 2, 8, 32, 16, dtype, "cpu", routing=one_expert_routing(40, 2, 8, hot=3, seed=2))
        check_moe(9, 2, 8, 32, 16, dtype, "cpu", routing=unused_expert_routing(9, 2, 8, {0, 7}, seed=3))
        check_moe(5, 2, 4, 64, 32, dtype, "cpu", config=moe_config(4096, 8, 4, dtype))  # the prefill tiles
        gemv = moe_config(1, 1, 64, dtype)  # the decode GEMVs, whatever T; H not a multiple of BLOCK_K
        check_moe(1, 1, 8, 32, 24, dtype, "cpu", config=gemv)
        check_moe(6, 3, 8, 48, 40, dtype, "cpu", seed=4, config=gemv)
        check_moe(5, 2, 8, 32, 16, dtype, "cpu", config=gemv, routing=one_expert_routing(5, 2, 8, hot=3, seed=2))
        # expert parallelism: -1 pairs (experts of another rank) dropped as the reference skips them, both paths
        remote = remote_expert_routing(13, 3, 8, seed=5)
        assert (remote == -1).any() and (remote == -1).all(1).any() and (remote >= 0).any()
        check_moe(13, 3, 8, 32, 16, dtype, "cpu", routing=remote)  # moe_align's blocks
        check_moe(13, 3, 8, 48, 40, dtype, "cpu", config=gemv, routing=remote)
    print("interpreter checks passed")


@pytest.mark.slow
def test_kernels_under_the_interpreter():
    """moe_align and fused_moe through Triton's CPU interpreter (a subprocess: TRITON_INTERPRET is read at
    import). The interpreter of triton 3.6 cannot run loops with runtime bounds under numpy >= 2.4."""
    run_under_interpreter("from tests.kernels.test_triton_moe import interpreter_checks; interpreter_checks()",
                          "interpreter checks passed")
