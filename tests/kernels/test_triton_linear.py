"""Triton linear (GEMV for a few rows) vs F.linear in float64 on CPU copies, and its fall-back to F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from atom_kernels import dispatch  # noqa: E402  (after the triton skip)
from atom_kernels.triton.linear import GEMV_MAX_ROWS, linear  # noqa: E402
from tests.kernels.test_triton_attention import ids  # noqa: E402

pytestmark = pytest.mark.gpu
# One rounding of the output plus fp32 sums in another order; relative to the largest |y| of the case.
TOL = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def _case(m, n, k, dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, w, b


def _check(got, x, w, b):
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert got.dtype == x.dtype and got.shape == want.shape
    err = (got.cpu().double() - want).abs().max() / want.abs().max()
    assert err <= TOL[x.dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize("dtype", list(TOL), ids=ids)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n,k", [(4096, 1024), (1024, 3072), (1000, 1000), (37, 72), (151936, 64), (8, 4100)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_matches_float64(dtype, m, n, k, bias):
    x, w, b = _case(m, n, k, dtype, bias)
    got = linear(x.cuda(), w.cuda(), None if b is None else b.cuda())
    _check(got, x, w, b)


def test_leading_dims_and_strided_rows():
    """x [2, 3, K] and x a column slice (rows strided, K contiguous) give F.linear's shapes and values."""
    x, w, b = _case(6, 256, 512, torch.bfloat16, True)
    got = linear(x.view(2, 3, 512).cuda(), w.cuda(), b.cuda())
    assert got.shape == (2, 3, 256)
    _check(got.view(6, 256), x, w, b)
    wide = torch.randn(4, 1024, dtype=torch.bfloat16)
    got = linear(wide.cuda()[:, 100:612], w.cuda())
    _check(got, wide[:, 100:612], w, None)


def test_dispatcher_runs_gemv_for_few_rows_and_cublas_above(monkeypatch):
    """The dispatcher's CUDA linear is this kernel; above GEMV_MAX_ROWS rows (and for a transposed weight) it is
    F.linear, bit for bit."""
    import atom_kernels
    import atom_kernels.triton.linear as tl_linear

    assert dispatch.backend("linear", torch.device("cuda")) == "triton"
    launched = []
    monkeypatch.setattr(tl_linear, "gemv", lambda *a, **kw: launched.append(a[0].shape) or F.linear(*a[:3]))
    x, w, _ = _case(GEMV_MAX_ROWS + 1, 512, 256, torch.bfloat16, False)
    x, w = x.cuda(), w.cuda()
    assert torch.equal(atom_kernels.linear(x, w), F.linear(x, w)) and not launched
    wt = w.t().contiguous().t()  # same values, stride(1) != 1
    assert torch.equal(atom_kernels.linear(x[:2], wt), F.linear(x[:2], wt)) and not launched
    atom_kernels.linear(x[:GEMV_MAX_ROWS], w)
    assert launched == [(GEMV_MAX_ROWS, 256)]
