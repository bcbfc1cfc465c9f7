"""RMSNorm → linear and SiLU-and-mul → linear as one Triton GEMV with a prologue (one row), vs the torch reference
ops in the input dtype (so the input rounds as theirs does) followed by F.linear in float64; and the hand-over to
the two separate ops for anything else."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import atom_kernels  # noqa: E402  (after the triton skip)
import atom_kernels.triton.fused_linear as fused  # noqa: E402
from atom_kernels import reference  # noqa: E402
from tests.kernels.test_triton_attention import ids  # noqa: E402
from tests.kernels.test_triton_linear import TOL  # noqa: E402

pytestmark = pytest.mark.gpu
SHAPES = [(4096, 1024), (1024, 3072), (37, 72), (5, 1030), (3, 4100)]


def norm_case(n, k, dtype, residual, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, k, generator=g) * 3).to(dtype)
    r = torch.randn(1, k, generator=g).to(dtype) if residual else None
    nw = (1 + torch.randn(k, generator=g) * 0.3).to(dtype)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, r, nw, w, b


def check_norm_linear(got, x, r, nw, w, b, eps=1e-6):
    y, res = got
    h = reference.rms_norm(x, nw, eps) if r is None else reference.rms_norm(x, nw, eps, r)[0]
    want = F.linear(h.double(), w.double(), None if b is None else b.double())
    assert y.dtype == x.dtype and y.shape == want.shape
    err = (y.cpu().double() - want).abs().max() / want.abs().max()
    assert err <= TOL[x.dtype], f"relative error {err:.2e}"
    assert torch.equal(res.cpu(), x if r is None else x + r)  # the new residual, exactly as the reference adds


def check_silu_linear(got, x, w, b):
    want = F.linear(reference.silu_and_mul(x).double(), w.double(), None if b is None else b.double())
    assert got.dtype == x.dtype and got.shape == want.shape
    err = (got.cpu().double() - want).abs().max() / want.abs().max()
    assert err <= TOL[x.dtype], f"relative error {err:.2e}"


def silu_case(n, k, dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, 2 * k, generator=g) * 2).to(dtype)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, w, b


def cuda(*ts):
    return [None if t is None else t.cuda() for t in ts]


@pytest.mark.parametrize("dtype", list(TOL), ids=ids)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_linear_matches_reference(dtype, n, k, residual):
    x, r, nw, w, b = norm_case(n, k, dtype, residual, bias=n % 2 == 1)
    got = fused.rms_norm_linear(*cuda(x, r, nw), 1e-6, *cuda(w, b))
    check_norm_linear(got, x, r, nw, w, b)


def test_rms_norm_linear_without_residual_returns_the_input_as_residual():
    x, _, nw, w, _ = norm_case(64, 256, torch.bfloat16, False, False)
    xc = x.cuda()
    assert fused.rms_norm_linear(xc, None, nw.cuda(), 1e-6, w.cuda())[1] is xc


@pytest.mark.parametrize("dtype", list(TOL), ids=ids)
@pytest.mark.parametrize("n,k", SHAPES)
def test_silu_and_mul_linear_matches_reference(dtype, n, k):
    x, w, b = silu_case(n, k, dtype, bias=n % 2 == 1)
    check_silu_linear(fused.silu_and_mul_linear(*cuda(x, w, b)), x, w, b)


def test_other_inputs_run_the_two_ops_bit_for_bit(monkeypatch):
    """Two rows: the dispatcher's separate norm/activation and linear."""
    launched = []
    monkeypatch.setattr(fused, "gemv", lambda *a, **k: launched.append(k) or pytest.fail("fused GEMV launched"))
    x, r, nw, w, _ = norm_case(512, 256, torch.bfloat16, True, False)
    x2, r2 = cuda(torch.cat([x, x * 2]), torch.cat([r, r]))
    y, res = fused.rms_norm_linear(x2, r2, nw.cuda(), 1e-6, w.cuda())
    h, res_want = atom_kernels.rms_norm(x2, nw.cuda(), 1e-6, r2)
    assert torch.equal(y, atom_kernels.linear(h, w.cuda())) and torch.equal(res, res_want)
    xs, ws, _ = silu_case(512, 256, torch.bfloat16, False)
    xs2 = torch.cat([xs, xs]).cuda()
    assert torch.equal(fused.silu_and_mul_linear(xs2, ws.cuda()),
                       atom_kernels.linear(atom_kernels.silu_and_mul(xs2), ws.cuda()))
    assert not launched
