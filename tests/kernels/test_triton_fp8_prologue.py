"""The fp8 linear with its input op fused (kernels/triton/fp8_prologue.py) under Triton's CPU interpreter: the norm and
SiLU-and-mul kernels that quantize give the bits of their separate Triton kernels followed by fp8_quantize_rows
(values and scales, row-major and M-major), and the fused ops match the reference (the torch norm or activation,
then the reference fp8_linear) on the GEMV (M <= 32) and tile (M > 32) paths, with a residual or none, a bias, a K
that is not a power of two and a partial last group; canaries: a scale block moved by one must fail, and so must a
norm weight the kernel did not get. Marked gpu: the same on CUDA at model shapes, the cuBLAS path included."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.interpreter import run_under_interpreter  # noqa: E402

CASES = ((1, 64, 256, False), (5, 100, 320, True), (40, 72, 384, True))  # (M, N, K, bias): GEMV, GEMV, tile


def _operands(m, n, k, dtype, device="cpu", seed=0):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    # activations spread over 16x between groups, so a scale applied to the wrong group shows
    spread = torch.randint(-2, 3, (m, -(-k // 128)), generator=g, device=device).exp2().repeat_interleave(128, 1)[:, :k]
    x = (torch.randn(m, k, generator=g, device=device) * spread).to(dtype)
    residual = torch.randn(m, k, generator=g, device=device).to(dtype)
    norm_w = (1 + torch.rand(k, generator=g, device=device)).to(dtype)
    gate_up = (torch.randn(m, 2 * k, generator=g, device=device) * 2).to(dtype)
    wq = torch.randn(n, k, generator=g, device=device).to(torch.float8_e4m3fn)
    scale = torch.rand(n, -(-k // 128), generator=g, device=device) / 100 + 1e-3
    bias = torch.randn(n, generator=g, device=device).to(dtype)
    return x, residual, norm_w, gate_up, wq, scale, bias


def quantize_checks() -> None:
    """The quantizing norm and SiLU kernels == their separate Triton kernels + fp8_quantize_rows, bit for bit."""
    import torch

    from atom_kernels.triton.activation import silu_and_mul
    from atom_kernels.triton.fp8_prologue import rms_norm_quantize, silu_and_mul_quantize
    from atom_kernels.triton.fp8_quant import fp8_quantize_rows
    from atom_kernels.triton.norm import rms_norm

    for m, k, group in ((1, 256, 128), (3, 320, 128), (2, 2500, 128), (4, 96, 32)):
        x, residual, norm_w, gate_up, *_ = _operands(m, k, k, torch.bfloat16)
        for res in (None, residual):
            h, want_res = (rms_norm(x, norm_w, 1e-6), x) if res is None else rms_norm(x, norm_w, 1e-6, res)
            for m_major in (False, True):
                want_q, want_s = fp8_quantize_rows(h, group, m_major)
                q, s, got_res = rms_norm_quantize(x, res, norm_w, 1e-6, group, m_major)
                assert torch.equal(q.float(), want_q.float()) and torch.equal(s, want_s), (m, k, group, m_major)
                assert s.stride() == want_s.stride() and torch.equal(got_res, want_res)
        want_q, want_s = fp8_quantize_rows(silu_and_mul(gate_up), group)
        q, s = silu_and_mul_quantize(gate_up, group, False)
        assert torch.equal(q.float(), want_q.float()) and torch.equal(s, want_s), (m, k, group)
    print("quantize checks passed")


def fused_op_checks() -> None:
    """rms_norm_fp8_linear and silu_and_mul_fp8_linear vs the reference (its torch norm / activation, then the
    reference fp8_linear) in float32 and vs the separate Triton kernels in bf16 (the interpreter's fp32 -> bf16 cast
    is not torch's rounding, and a group maximum rounded otherwise moves the group's whole quantization), with
    canaries."""
    import torch

    from atom_kernels.reference import fused_linear as reference
    from atom_kernels.triton import activation, fp8_linear, norm
    from atom_kernels.triton.fp8_prologue import rms_norm_fp8_linear, silu_and_mul_fp8_linear

    for m, n, k, with_bias in CASES:
        for dtype in (torch.float32, torch.bfloat16):
            x, residual, norm_w, gate_up, wq, scale, bias = _operands(m, n, k, dtype)
            bias = bias if with_bias else None
            args = (wq, scale, 128, 128, None, bias)
            for res in (None, residual):
                got, got_res = rms_norm_fp8_linear(x, res, norm_w, 1e-6, *args)
                if dtype == torch.float32:
                    want, want_res = reference.rms_norm_fp8_linear(x, res, norm_w, 1e-6, *args)
                    _assert_close(got, want, 1e-5, (m, n, k, dtype))
                else:
                    h, want_res = (norm.rms_norm(x, norm_w, 1e-6), x) if res is None else norm.rms_norm(x, norm_w,
                                                                                                       1e-6, res)
                    want = fp8_linear.fp8_linear(h, *args)
                    assert torch.equal(got, want), (m, n, k)
                assert torch.equal(got_res, want_res)
                moved = reference.rms_norm_fp8_linear(x, res, norm_w, 1e-6, wq, scale.roll(1, 1), 128, 128, None,
                                                      bias)[0]
                assert not _close(got, moved, 1e-2), "a moved scale block went unnoticed"
                other_norm = reference.rms_norm_fp8_linear(x, res, norm_w.flip(0), 1e-6, *args)[0]
                assert not _close(got, other_norm, 1e-2), "the norm weight went unnoticed"
            got = silu_and_mul_fp8_linear(gate_up, *args)
            if dtype == torch.float32:
                _assert_close(got, reference.silu_and_mul_fp8_linear(gate_up, *args), 1e-5, (m, n, k, dtype))
            else:
                assert torch.equal(got, fp8_linear.fp8_linear(activation.silu_and_mul(gate_up), *args)), (m, n, k)
            assert not _close(got, reference.silu_and_mul_fp8_linear(gate_up.roll(1, 1), *args), 1e-2)
    # outside the kernels (a static input scale): the reference's answer
    x, residual, norm_w, gate_up, wq, scale, bias = _operands(3, 64, 256, torch.float32)
    static = torch.tensor([0.05])
    assert torch.equal(rms_norm_fp8_linear(x, None, norm_w, 1e-6, wq, scale, 128, 0, static)[0],
                       reference.rms_norm_fp8_linear(x, None, norm_w, 1e-6, wq, scale, 128, 0, static)[0])
    print("fused op checks passed")


def _close(got, want, tol) -> bool:
    """Relative L2 within tol: one e4m3 step more or less in an element (a 16-bit rounding upstream that differs, as
    the interpreter's casts do) moves it by ~1e-3; a misplaced scale block or norm weight by tens of percent."""
    return bool((got.float() - want.float()).norm() <= tol * want.float().norm())


def _assert_close(got, want, tol, what) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err <= tol, f"{what}: relative L2 error {err:.2e} > {tol}"


def test_quantizing_norm_and_silu_kernels_under_the_interpreter():
    code = "from tests.kernels.test_triton_fp8_prologue import quantize_checks; quantize_checks()"
    run_under_interpreter(code, "quantize checks passed")


def test_fused_fp8_linear_ops_under_the_interpreter():
    code = "from tests.kernels.test_triton_fp8_prologue import fused_op_checks; fused_op_checks()"
    run_under_interpreter(code, "fused op checks passed")


GPU_SHAPES = ((1, 2112, 7168), (8, 4096, 1024), (32, 2048, 3072), (64, 6144, 4096), (512, 7168, 2048),
              (256, 3072, 7168))  # (M, N, K): the GEMV, tile and (K >= 7168, M > 32 / M >= 256) cuBLAS paths


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
def test_fused_fp8_linear_ops_on_gpu(m, n, k):
    import torch

    from atom_kernels.reference import fused_linear as reference
    from atom_kernels.triton.fp8_prologue import rms_norm_fp8_linear, silu_and_mul_fp8_linear

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x, residual, norm_w, gate_up, wq, scale, bias = _operands(m, n, k, torch.bfloat16, "cuda", seed=m)
    scale = scale[::128].repeat_interleave(128, 0)[:n].contiguous()  # whole 128-row blocks: block_n 128 is true
    args = (wq, scale, 128, 128, None, None, 128)
    got, got_res = rms_norm_fp8_linear(x, residual, norm_w, 1e-6, *args)
    want, want_res = reference.rms_norm_fp8_linear(x.cpu(), residual.cpu(), norm_w.cpu(), 1e-6, wq.cpu(), scale.cpu(),
                                                   128, 128, None, None, 128)
    _assert_close(got.cpu(), want, 1e-2, (m, n, k))
    assert torch.equal(got_res.cpu(), want_res)
    got = silu_and_mul_fp8_linear(gate_up, *args)
    want = reference.silu_and_mul_fp8_linear(gate_up.cpu(), wq.cpu(), scale.cpu(), 128, 128, None, None, 128)
    _assert_close(got.cpu(), want, 1e-2, (m, n, k))
    moved = silu_and_mul_fp8_linear(gate_up, wq, scale.roll(1, 1), 128, 128, None, None, 128)
    assert not _close(moved.cpu(), want, 1e-2)
