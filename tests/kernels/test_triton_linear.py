"""Triton linear (a GEMV for one row) vs F.linear in float64 on CPU copies, and its hand-over to F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import atom_kernels  # noqa: E402  (after the triton skip)
import atom_kernels.triton.linear as triton_linear  # noqa: E402
from atom_kernels import dispatch  # noqa: E402
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
@pytest.mark.parametrize("n,k", [(4096, 1024), (1024, 3072), (1000, 1000), (37, 72), (151936, 64), (3, 4100),
                                 (4096, 14336)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_matches_float64(dtype, n, k, bias):
    x, w, b = _case(1, n, k, dtype, bias)
    got = triton_linear.linear(x.cuda(), w.cuda(), None if b is None else b.cuda())
    _check(got, x, w, b)


def test_leading_dims_and_strided_row():
    """x [1, 1, K] keeps its leading dims; a row with stride 2 between elements is read right."""
    x, w, b = _case(1, 256, 512, torch.bfloat16, True)
    got = triton_linear.linear(x.view(1, 1, 512).cuda(), w.cuda(), b.cuda())
    assert got.shape == (1, 1, 256)
    _check(got.view(1, 256), x, w, b)
    wide = torch.randn(1, 1024, dtype=torch.bfloat16)
    got = triton_linear.linear(wide.cuda()[:, ::2], w.cuda())
    _check(got, wide[:, ::2], w, None)


def test_dispatcher_runs_gemv_for_one_row_and_cublas_otherwise(monkeypatch):
    """The dispatcher's CUDA linear launches the GEMV for one row only; more rows or a transposed weight get
    F.linear, bit for bit."""
    assert dispatch.backend("linear", torch.device("cuda")) == "triton"
    launched = []
    monkeypatch.setattr(triton_linear, "gemv", lambda *a, **kw: launched.append(a[0].shape) or F.linear(*a[:3]))
    x, w, _ = _case(2, 512, 256, torch.bfloat16, False)
    x, w = x.cuda(), w.cuda()
    wt = w.t().contiguous().t()  # same values, stride(1) != 1
    for args in ((x, w), (x[:1], wt)):
        assert torch.equal(atom_kernels.linear(*args), F.linear(*args)) and not launched
    atom_kernels.linear(x[:1], w)
    assert launched == [(256,)]
