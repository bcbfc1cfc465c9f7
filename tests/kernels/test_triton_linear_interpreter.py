"""The Triton one-row linear (GEMV) vs F.linear in float64 under Triton's CPU interpreter (CI has no GPU).

Small shapes on CPU tensors, in a subprocess (TRITON_INTERPRET is read at import): K a multiple of the tile and
not, N not a multiple of the 4-row tile (the last program re-reads row N-1), with and without bias, in every float
dtype (no tensor-core dot here, so bf16 runs right under the interpreter too). test_triton_linear.py covers the
compiled kernel at model sizes on a GPU.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from atom_kernels.triton.linear import linear  # noqa: E402  (after the triton skip)
from tests.interpreter import run_under_interpreter  # noqa: E402
from tests.kernels.test_triton_linear import TOL, _case, _check  # noqa: E402


def interpreter_checks() -> None:
    for dtype in TOL:
        for n, k in ((64, 256), (37, 72), (5, 1030), (130, 2048)):
            for bias in (False, True):
                x, w, b = _case(1, n, k, dtype, bias, seed=n + k)
                _check(linear(x, w, b), x, w, b)
    print("interpreter checks passed")


def test_gemv_under_the_interpreter():
    code = "from tests.kernels.test_triton_linear_interpreter import interpreter_checks; interpreter_checks()"
    run_under_interpreter(code, "interpreter checks passed")
