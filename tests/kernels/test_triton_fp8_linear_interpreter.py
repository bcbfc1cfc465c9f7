"""The Triton block-scaled FP8 GEMM vs the torch reference (atom_kernels.reference.fp8) under Triton's CPU
interpreter (CI has no GPU): partial K blocks, N and M not multiples of the tiles, bias, bf16 and float32 inputs;
shapes outside the kernel (per-channel scales, a static input scale) take the reference."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.interpreter import run_under_interpreter  # noqa: E402


def interpreter_checks() -> None:
    import torch

    from atom_kernels.reference.fp8 import fp8_linear as reference
    from atom_kernels.triton.fp8_linear import fp8_linear

    torch.manual_seed(0)
    for m, n, k, dtype, bias in ((1, 64, 256, torch.float32, False), (5, 100, 320, torch.bfloat16, True),
                                 (33, 130, 200, torch.float32, True)):
        x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k)
        scale = torch.rand(n, -(-k // 128)) / 100 + 1e-3
        wq, b = w.to(torch.float8_e4m3fn), torch.randn(n) if bias else None
        got, want = fp8_linear(x, wq, scale, 128, 128, None, b), reference(x, wq, scale, 128, 128, None, b)
        assert got.dtype == dtype and got.shape == (m, n)
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        shifted = fp8_linear(x, wq, scale.roll(1, 1), 128, 128, None, b)  # the scales' blocks matter
        assert not torch.allclose(shifted.float(), want.float(), rtol=tol, atol=tol)
    per_channel = torch.rand(64, 1)
    x, wq = torch.randn(3, 96), torch.randn(64, 96).to(torch.float8_e4m3fn)
    torch.testing.assert_close(fp8_linear(x, wq, per_channel, 96, 96), reference(x, wq, per_channel, 96, 96))
    print("interpreter checks passed")


def test_block_scaled_fp8_gemm_under_the_interpreter():
    code = "from tests.kernels.test_triton_fp8_linear_interpreter import interpreter_checks; interpreter_checks()"
    run_under_interpreter(code, "interpreter checks passed")
