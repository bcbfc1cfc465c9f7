"""Triton rms_norm (+ residual), rotary and silu_and_mul vs the torch references (on CPU copies)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from atom_kernels import reference as ref  # noqa: E402  (after the triton skip)
from atom_kernels.triton.activation import silu_and_mul  # noqa: E402
from atom_kernels.triton.norm import rms_norm  # noqa: E402
from atom_kernels.triton.rotary import rotary  # noqa: E402
from tests.kernels.test_triton_attention import ids  # noqa: E402

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# Rotary tolerances: two rounding steps at the inputs' magnitude (|x| < 4 here). The reference rounds
# x*cos to the dtype before adding; the compiled kernel may fuse that product into an FMA (one rounding
# fewer), which differs by an ulp, and by more than any relative tolerance where the sum cancels to ~0.
ROPE_TOL = {torch.float32: dict(rtol=1.3e-6, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=3.2e-2),
            torch.float16: dict(rtol=1e-3, atol=4e-3)}


def _close(got, want, **tol):
    """Same dtype and shape; values equal up to one rounding step of the dtype (different reduction order)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("shape", [(7, 1024), (1, 4096), (5, 1000), (3, 2, 5, 64)])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm(dtype, shape, residual):
    x = _randn(*shape, dtype=dtype, seed=len(shape) + shape[-1])
    w = (1 + 0.2 * _randn(shape[-1], dtype=torch.float32, seed=1)).to(dtype)
    r = _randn(*shape, dtype=dtype, seed=2) if residual else None
    want = ref.rms_norm(x, w, 1e-6, r)
    got = rms_norm(x.cuda(), w.cuda(), 1e-6, r.cuda() if residual else None)
    if residual:
        _close(got[0], want[0])
        torch.testing.assert_close(got[1].cpu(), want[1], rtol=0, atol=0)  # x + residual: one exact rounding
    else:
        _close(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=ids)
def test_rms_norm_per_head_on_strided_view_and_fp32_weight(dtype):
    """Qwen3's q_norm: [T, heads, d] views into the qkv output; an fp32 weight promotes the output to fp32."""
    qkv = _randn(9, 40 * 128, dtype=dtype, seed=3).cuda()
    q = qkv[:, : 16 * 128].view(9, 16, 128)
    for w in (_randn(128, dtype=dtype, seed=4), _randn(128, dtype=torch.float32, seed=5)):
        got, want = rms_norm(q, w.cuda(), 1e-6), ref.rms_norm(q.cpu(), w, 1e-6)
        assert got.dtype == want.dtype == torch.result_type(w, q)
        # the normed x is rounded to x's dtype before the (fp32) weight: allow one step of that rounding
        tol = 1.6e-2 if dtype == torch.bfloat16 else 1.3e-6
        torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("heads, kv_heads, d, rot", [(16, 8, 128, 128), (8, 1, 64, 32), (5, 5, 80, 80)])
def test_rotary(dtype, heads, kv_heads, d, rot):
    t = 13
    qkv = _randn(t, (heads + 2 * kv_heads) * d, dtype=dtype, seed=heads + d).cuda()
    q = qkv[:, : heads * d].view(t, heads, d)  # strided views, as the model passes them
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(t, kv_heads, d)
    cos_sin = _randn(300, rot, dtype=torch.float32, seed=6)
    positions = torch.randint(0, 300, (t,), generator=torch.Generator().manual_seed(7))
    want_q, want_k = ref.rotary(positions, q.cpu(), k.cpu(), cos_sin)
    got_q, got_k = rotary(positions.cuda(), q, k, cos_sin.cuda())
    _close(got_q, want_q, **ROPE_TOL[dtype])
    _close(got_k, want_k, **ROPE_TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("shape", [(7, 2 * 1000), (2, 3, 2 * 64), (1, 2 * 11008), (0, 2 * 64)])
def test_silu_and_mul(dtype, shape):
    x = _randn(*shape, dtype=dtype, seed=shape[-1])
    _close(silu_and_mul(x.cuda()), ref.silu_and_mul(x))


def test_rejects_bad_arguments():
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm(x, torch.ones(32, device="cuda"), 1e-6)
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.randn(3, 7, device="cuda"))
    with pytest.raises(ValueError, match="rot_dim"):
        rotary(torch.zeros(4, dtype=torch.long, device="cuda"), x.view(4, 1, 64), x.view(4, 1, 64),
               torch.ones(10, 66, device="cuda"))
