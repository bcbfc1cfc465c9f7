"""Triton write_kv_cache vs the torch reference: every dtype, host cache layouts, fp8 with scales, padding."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from atom_kernels import reference as ref  # noqa: E402  (after the triton skip)
from atom_kernels.triton.kv_cache import write_kv_cache  # noqa: E402
from tests.kernels.test_triton_attention import ids, make_caches  # noqa: E402

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn


def _case(tokens, kv_heads, d, num_blocks, block_size, dtype, cache_dtype, layout, seed):
    g = torch.Generator().manual_seed(seed)
    # key/value as strided views of one [T, 2 * kv_heads * d] buffer, as a fused projection leaves them
    kv = torch.randn(tokens, 2 * kv_heads * d, generator=g).to(dtype).cuda()
    key = kv[:, : kv_heads * d].view(tokens, kv_heads, d)
    value = kv[:, kv_heads * d :].view(tokens, kv_heads, d)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens]
    slots[:: max(tokens // 3, 1)] = -1  # padding rows
    kc, vc = make_caches(num_blocks, block_size, kv_heads, d, cache_dtype, layout)
    return key, value, kc, vc, slots.cuda()


def _write_both(key, value, kc, vc, slots, scales):
    """(triton caches, reference caches on CPU), both starting from the same NaN-filled caches."""
    want_k, want_v = kc.cpu(), vc.cpu()
    cpu_scales = [s.cpu() if s is not None else None for s in scales]
    ref.write_kv_cache(key.cpu(), value.cpu(), want_k, want_v, slots.cpu(), *cpu_scales)
    write_kv_cache(key, value, kc, vc, slots, *scales)
    return (kc.cpu(), vc.cpu()), (want_k, want_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=ids)
@pytest.mark.parametrize("layout, block_size, kv_heads, d", [
    ("native", 16, 8, 128), ("native", 7, 3, 80), ("vllm", 16, 2, 64), ("sglang", 1, 4, 128)])
def test_write_matches_reference_exactly(dtype, layout, block_size, kv_heads, d):
    num_blocks = -(-40 // block_size) + 2
    key, value, kc, vc, slots = _case(37, kv_heads, d, num_blocks, block_size, dtype, dtype, layout, seed=d)
    got, want = _write_both(key, value, kc, vc, slots, (None, None))
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w, rtol=0, atol=0, equal_nan=True)  # untouched slots stay NaN


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=ids)
@pytest.mark.parametrize("layout, block_size", [("native", 16), ("vllm", 16), ("native", 1)])
def test_fp8_write_with_scales(dtype, layout, block_size):
    key, value, kc, vc, slots = _case(29, 4, 128, 40, block_size, dtype, FP8, layout, seed=block_size)
    scales = (torch.tensor(0.3, device="cuda"), torch.tensor(2.5, device="cuda"))
    got, want = _write_both(key, value, kc, vc, slots, scales)
    for g_, w in zip(got, want):
        g_, w = g_.float(), w.float()
        assert torch.equal(g_.isnan(), w.isnan())
        # same e4m3 value, or (a rounding tie broken the other way) one e4m3 step apart
        torch.testing.assert_close(g_, w, rtol=0.125, atol=2**-9, equal_nan=True)
        assert (g_ == w).logical_or(g_.isnan()).float().mean() > 0.99


def test_rejects_bad_arguments():
    key, value, kc, vc, slots = _case(5, 2, 64, 4, 16, torch.bfloat16, torch.bfloat16, "native", seed=0)
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv_cache(key, value, kc, vc, slots[:3])
    with pytest.raises(ValueError, match="kv_heads, head_dim"):
        write_kv_cache(key[:, :1], value[:, :1], kc, vc, slots)
    with pytest.raises(ValueError, match="both k_scale and v_scale"):
        write_kv_cache(key, value, kc, vc, slots, torch.ones((), device="cuda"))
