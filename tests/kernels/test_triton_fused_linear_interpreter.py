"""The fused norm/activation GEMV prologues under Triton's CPU interpreter (CI has no GPU): small shapes, K a
multiple of the tile and not, with and without residual and bias, fp32 and fp16, against the torch reference ops.
Not bf16: the interpreter does not round to bf16 as torch does (its own rms_norm kernel differs from the reference in
196 of 256 elements there), so the prologue's roundings cannot be checked in it. test_triton_fused_linear.py covers
the compiled kernel in every dtype at model sizes on a GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from atom_kernels.triton import fused_linear as fused  # noqa: E402  (after the triton skip)
from tests.interpreter import run_under_interpreter  # noqa: E402
from tests.kernels.test_triton_fused_linear import (  # noqa: E402
    check_norm_linear,
    check_silu_linear,
    norm_case,
    silu_case,
)


def interpreter_checks() -> None:
    for dtype in (torch.float32, torch.float16):
        for n, k in ((64, 256), (37, 72), (5, 1030)):
            for residual in (False, True):
                x, r, nw, w, b = norm_case(n, k, dtype, residual, bias=residual, seed=n + k)
                check_norm_linear(fused.rms_norm_linear(x, r, nw, 1e-6, w, b), x, r, nw, w, b)
            x, w, b = silu_case(n, k, dtype, bias=n % 2 == 1, seed=n)
            check_silu_linear(fused.silu_and_mul_linear(x, w, b), x, w, b)
    print("interpreter checks passed")


def test_fused_prologues_under_the_interpreter():
    code = ("from tests.kernels.test_triton_fused_linear_interpreter import interpreter_checks; "
            "interpreter_checks()")
    run_under_interpreter(code, "interpreter checks passed")
