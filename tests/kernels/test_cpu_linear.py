"""atom_kernels' CPU GEMM (oneDNN over prepacked float32 weights): what it computes (that an engine on the CPU runs it
for every linear layer: test_cpu_kernels.py). Greedy tokens == transformers with it: test_parity and friends."""

from __future__ import annotations

import pytest
import torch

from atom_kernels.cpu import linear as cpu_linear

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("rows", [(1,), (8,), (3, 5), (300,)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64_matmul(rows, bias):
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(40, 24, generator=g), torch.randn(*rows, 48, generator=g)[..., ::2]  # x strided too
    b = torch.randn(40, generator=g) if bias else None
    packed = cpu_linear.pack_linear(w, b)
    assert packed is not None and packed.is_mkldnn
    want = x.double() @ w.double().T + (b.double() if bias else 0)
    torch.testing.assert_close(cpu_linear.linear(x, w, b, packed), want.float())


def test_other_dtypes_keep_f_linear():
    w, x = torch.randn(8, 4, dtype=torch.bfloat16), torch.randn(2, 4, dtype=torch.bfloat16)
    assert cpu_linear.pack_linear(w) is None
    assert torch.equal(cpu_linear.linear(x, w, None, None), torch.nn.functional.linear(x, w))
