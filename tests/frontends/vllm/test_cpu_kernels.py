"""vLLM's CPU attention kernels as atom_kernels' "provided" backend (atom_frontends.vllm.cpu_kernels): the same
results as the torch reference on vLLM's head-major cache pages, per-step scheduler metadata made once, and
the reference (one log line) where vLLM's kernels do not apply."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("vllm")

import atom_kernels  # noqa: E402
from atom_kernels import dispatch  # noqa: E402

HEADS, KV_HEADS, D, NUM_BLOCKS = 8, 2, 32, 48
# (cached context tokens, new tokens): decodes first, then prefills over a cached prefix, one of a whole block
REQUESTS = [(40, 1), (70, 1), (5, 1), (0, 37), (33, 12), (64, 32)]


def _kv_cache(block_size: int, head_major: bool, dtype) -> torch.Tensor:
    """vLLM's per-layer view [blocks, kv_heads, block_size, 2*d] for layout LBHNC (head-major) or LBNHC."""
    if head_major:
        return torch.zeros(NUM_BLOCKS, KV_HEADS, block_size, 2 * D, dtype=dtype)
    return torch.zeros(NUM_BLOCKS, block_size, KV_HEADS, 2 * D, dtype=dtype).transpose(1, 2)


def _batch(block_size: int, g: torch.Generator):
    """Block tables, slots per token of every request (its whole context), seq_lens, query_start_loc."""
    seq_lens = [c + n for c, n in REQUESTS]
    width = max(-(-s // block_size) for s in seq_lens)
    table = torch.randperm(NUM_BLOCKS, generator=g)[: width * len(REQUESTS)].view(len(REQUESTS), width).int()
    slots = [table[r, torch.arange(s) // block_size].long() * block_size + torch.arange(s) % block_size
             for r, s in enumerate(seq_lens)]
    qsl = torch.tensor([0] + [n for _, n in REQUESTS]).cumsum(0).int()
    return table, slots, torch.tensor(seq_lens, dtype=torch.int32), qsl


def _step(kv_cache, block_size, dtype, sliding_window, g):
    """Earlier steps' K/V written, then this step's written and attended, through atom_kernels (dispatched)."""
    from atom_frontends.vllm.backend import split_kv_cache

    table, slots, seq_lens, qsl = _batch(block_size, g)
    k_cache, v_cache = split_kv_cache(kv_cache, D)
    ks = [torch.randn(s, KV_HEADS, D, generator=g).to(dtype) for s in seq_lens.tolist()]
    vs = [torch.randn(s, KV_HEADS, D, generator=g).to(dtype) for s in seq_lens.tolist()]
    for (c, _), k, v, s in zip(REQUESTS, ks, vs, slots):  # the cached prefixes, as earlier steps wrote them
        if c:
            atom_kernels.write_kv_cache(k[:c], v[:c], k_cache, v_cache, s[:c])
    new_k = torch.cat([k[c:] for (c, _), k in zip(REQUESTS, ks)])
    new_v = torch.cat([v[c:] for (c, _), v in zip(REQUESTS, vs)])
    # q/k/v as the layer gets them: views of one fused projection's rows (strided, not contiguous)
    qkv = torch.randn(new_k.shape[0], (HEADS + 2 * KV_HEADS) * D, generator=g).to(dtype)
    q, k, v = qkv.split([HEADS * D, KV_HEADS * D, KV_HEADS * D], dim=-1)
    k.copy_(new_k.flatten(1))
    v.copy_(new_v.flatten(1))
    t = q.shape[0]
    atom_kernels.write_kv_cache(k.view(t, KV_HEADS, D), v.view(t, KV_HEADS, D), k_cache, v_cache,
                                torch.cat([s[c:] for (c, _), s in zip(REQUESTS, slots)]))
    scratch = {}
    out = torch.full((t, HEADS, D), float("nan"), dtype=dtype)
    atom_kernels.paged_attention(q.view(t, HEADS, D), k_cache, v_cache, table, seq_lens, qsl, D**-0.5,
                                 sliding_window=sliding_window, out=out, max_query_len=37,
                                 max_seq_len=int(seq_lens.max()), num_decodes=3, num_prefills=3,
                                 plan_cache=scratch)
    return out, scratch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sliding_window", [None, 24])
@pytest.mark.parametrize("block_size", [32, 64])
def test_vllm_kernels_match_the_reference(vllm_kernels, dtype, sliding_window, block_size):
    got, scratch = _step(_kv_cache(block_size, True, dtype), block_size, dtype, sliding_window,
                         torch.Generator().manual_seed(0))
    assert [k[0] for k in scratch] == ["vllm_cpu.scheduler_metadata"]  # vLLM's kernels ran, planned once
    with pytest.MonkeyPatch.context() as mp:  # the same step, all through the torch reference
        mp.setenv("ATOM_KERNEL_BACKEND", "torch")
        dispatch.reset()
        want, scratch = _step(_kv_cache(block_size, True, dtype), block_size, dtype, sliding_window,
                              torch.Generator().manual_seed(0))
    dispatch.reset()
    assert [k[0] for k in scratch] == ["reference.paged_attention"]
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got, want, **tol)


def test_scheduler_metadata_is_made_once_per_step(vllm_kernels, monkeypatch):
    from vllm import _custom_ops as ops

    from atom_frontends.vllm.backend import split_kv_cache

    calls = []
    real = ops.cpu_attn_get_scheduler_metadata
    monkeypatch.setattr(ops, "cpu_attn_get_scheduler_metadata", lambda **kw: calls.append(1) or real(**kw))
    _, scratch = _step(_kv_cache(32, True, torch.float32), 32, torch.float32, None, torch.Generator().manual_seed(1))
    sched = next(iter(scratch.values()))
    table, _, seq_lens, qsl = _batch(32, torch.Generator().manual_seed(1))
    for _ in range(3):  # further layers of the same step (scratch is the step's AttentionMetadata.plan_cache)
        q = torch.randn(sum(n for _, n in REQUESTS), HEADS, D)
        atom_kernels.paged_attention(q, *split_kv_cache(_kv_cache(32, True, torch.float32), D), table, seq_lens,
                                     qsl, D**-0.5, plan_cache=scratch)
    assert len(calls) == 1 and next(iter(scratch.values())) is sched


@pytest.mark.parametrize("block_size, head_major, reason", [
    (16, True, "block size 16 is not a multiple of 32"),
    (32, False, "not vLLM's head-major page"),
])
def test_unsupported_caches_run_the_reference_and_say_so(vllm_kernels, caplog, block_size, head_major, reason):
    from atom_frontends.vllm import cpu_kernels

    cpu_kernels._logged.clear()
    with caplog.at_level(logging.INFO, logger="vllm.atom_core"):
        got, scratch = _step(_kv_cache(block_size, head_major, torch.float32), block_size, torch.float32,
                             None, torch.Generator().manual_seed(2))
    assert [k[0] for k in scratch] == ["reference.paged_attention"]
    lines = [r.getMessage() for r in caplog.records if "torch reference" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0]  # once, for a prefix write, a step write and the attention
    dispatch.register("paged_attention", "provided", None)
    dispatch.register("write_kv_cache", "provided", None)
    want, _ = _step(_kv_cache(block_size, head_major, torch.float32), block_size, torch.float32, None,
                    torch.Generator().manual_seed(2))
    assert torch.equal(got, want)


def test_head_major_layout_comes_first_while_vllm_kernels_serve_us(vllm_kernels):
    from vllm.v1.kv_cache_layout import KVCacheLayout

    from atom_frontends.vllm.backend import AtomAttentionBackend

    assert AtomAttentionBackend.supported_kv_cache_layouts()[0] == KVCacheLayout.LBHNC
    dispatch.register("paged_attention", "provided", None)
    assert AtomAttentionBackend.supported_kv_cache_layouts()[0] == KVCacheLayout.LBNHC
