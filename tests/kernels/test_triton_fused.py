"""Triton fused_qk_norm_rope_write_kv vs its torch reference, and the Qwen3 switch on the GPU engine."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from atom_kernels import reference as ref  # noqa: E402  (after the triton skip)
from atom_kernels.triton.fused_qk_norm_rope import fused_qk_norm_rope_write_kv  # noqa: E402
from tests.kernels.test_fused_reference import greedy  # noqa: E402
from tests.kernels.test_triton_attention import ids, make_caches  # noqa: E402
from tests.kernels.test_triton_norm_rope_act import ROPE_TOL  # noqa: E402

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn


def _inputs(t, heads, kv_heads, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g).to(dtype).cuda()
    q = qkv[:, : heads * d].view(t, heads, d)  # strided views into the projection output
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(t, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(t, kv_heads, d)
    wq = (1 + 0.2 * torch.randn(d, generator=g)).to(dtype).cuda()
    wk = (1 + 0.2 * torch.randn(d, generator=g)).to(dtype).cuda()
    cos_sin = torch.randn(500, d, generator=g).cuda()
    positions = torch.randint(0, 500, (t,), generator=g).cuda()
    return positions, q, k, v, wq, wk, cos_sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=ids)
@pytest.mark.parametrize("cache, layout", [("same", "native"), ("fp8", "native"), ("same", "vllm"),
                                           ("fp8", "vllm")])
@pytest.mark.parametrize("heads, kv_heads, d, block_size", [(16, 8, 128, 16), (8, 2, 64, 1), (6, 6, 64, 5)])
def test_fused_matches_reference(dtype, cache, layout, heads, kv_heads, d, block_size):
    t = 23
    positions, q, k, v, wq, wk, cos_sin = _inputs(t, heads, kv_heads, d, dtype, seed=heads + d + block_size)
    cache_dtype = FP8 if cache == "fp8" else dtype
    num_blocks = -(-40 // block_size)
    kc, vc = make_caches(num_blocks, block_size, kv_heads, d, cache_dtype, layout)
    scales = (None, None)
    if cache == "fp8":
        scales = (torch.tensor(0.4, device="cuda"), torch.tensor(1.6, device="cuda"))
    slots = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(1))[:t]
    slots[::4] = -1
    slots = slots.cuda()
    want_kc, want_vc = kc.cpu(), vc.cpu()
    cpu = [x.cpu() for x in (positions, q, k, v, wq, wk)]
    want_q = ref.fused_qk_norm_rope_write_kv(*cpu, 1e-6, cos_sin.cpu(), want_kc, want_vc, slots.cpu(),
                                             *[s.cpu() if s is not None else None for s in scales])
    got_q = fused_qk_norm_rope_write_kv(positions, q, k, v, wq, wk, 1e-6, cos_sin, kc, vc, slots, *scales)
    assert got_q.dtype == want_q.dtype and got_q.shape == q.shape
    torch.testing.assert_close(got_q.cpu(), want_q, **ROPE_TOL[dtype])  # see ROPE_TOL: FMA vs 2 roundings
    for got, want in ((kc.cpu().float(), want_kc.float()), (vc.cpu().float(), want_vc.float())):
        assert torch.equal(got.isnan(), want.isnan())  # exactly the non-padding slots written
        if cache == "fp8":  # one e4m3 step where the rotated key differs by an ulp (stored = k / 0.4)
            torch.testing.assert_close(got, want, rtol=0.125, atol=0.05, equal_nan=True)
        else:
            torch.testing.assert_close(got, want, equal_nan=True, **ROPE_TOL[dtype])


@pytest.mark.parametrize("eager", [True, False])
def test_qwen3_switch_on_gpu(checkpoint_factory, monkeypatch, eager):
    """float32, eager and with decode CUDA graphs: the same greedy tokens with the switch on and off;
    with it on, the attention layer never writes the cache."""
    path = checkpoint_factory("Qwen3ForCausalLM")
    plain, plain_calls = greedy(path, monkeypatch, fused=False, dtype="float32", enforce_eager=eager)
    fused, fused_calls = greedy(path, monkeypatch, fused=True, dtype="float32", enforce_eager=eager)
    assert fused_calls["write_kv_cache"] == 0 and fused_calls["fused_qk_norm_rope_write_kv"] > 0
    assert plain_calls["fused_qk_norm_rope_write_kv"] == 0 and plain_calls["write_kv_cache"] > 0
    assert fused == plain
