"""The dispatcher: CPU picks the torch reference, and the lookup is traceable by torch.compile."""

from __future__ import annotations

import torch

import atom_kernels
from atom_kernels import dispatch, reference


def test_cpu_uses_the_reference_for_every_op():
    assert dispatch.describe("cpu") == {op: "torch" for op in dispatch.OPS}
    assert dispatch.get("rms_norm", torch.device("cpu")) is reference.rms_norm


def test_ops_trace_with_fullgraph_compile():
    # Hosts such as vLLM compile the decoder with fullgraph=True: a graph break would fail them.
    def f(x, w):
        return atom_kernels.silu_and_mul(atom_kernels.rms_norm(x, w, 1e-6))

    dispatch.reset()
    dispatch.resolve("cpu")  # what building a model does, before any host compiles it
    x, w = torch.randn(3, 8), torch.randn(8)
    got = torch.compile(f, fullgraph=True, backend="eager")(x, w)
    torch.testing.assert_close(got, f(x, w))
