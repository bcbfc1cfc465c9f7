"""On CUDA the dispatcher runs every op's Triton kernel; importing atom_kernels never imports ours."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from atom_kernels import dispatch

pytestmark = pytest.mark.gpu


def test_every_op_has_and_uses_its_triton_kernel(monkeypatch):
    monkeypatch.delenv("ATOM_KERNEL_BACKEND", raising=False)
    dispatch.reset()
    for op in dispatch.OPS:
        if op == "pack_linear":  # the Triton linear (a one-row GEMV, cuBLAS otherwise) wants no packed weight
            assert dispatch.backend_for(op, "cuda") == "torch"
            continue
        assert dispatch.backend_for(op, "cuda") == "triton", op
        fn = dispatch.get(op, torch.device("cuda"))
        assert fn.__module__.startswith("atom_kernels.triton."), (op, fn.__module__)
        # On CPU: the CPU kernel where atom_kernels/cpu has one, else the torch reference; never a Triton one.
        assert dispatch.backend_for(op, "cpu") == ("cpu" if "cpu" in dispatch._IMPLS[op] else "torch"), op


def test_triton_is_imported_lazily():
    """Our Triton modules (they import triton) load on first use only: CPU hosts need no triton."""
    code = "import sys, atom_kernels, atom_core.models; assert 'atom_kernels.triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
