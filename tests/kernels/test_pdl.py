"""Programmatic dependent launch: every Triton kernel we launch waits for the kernels before it before it touches
memory, and a chain of dependent launches (eager and in a CUDA graph) gives exactly what it gives without PDL."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest
import torch

pytest.importorskip("triton")

from triton.runtime.jit import JITFunction  # noqa: E402

import atom_kernels.triton as triton_pkg  # noqa: E402  (after the triton skip)
from atom_kernels.triton._utils import pdl  # noqa: E402

MEMORY_OPS = re.compile(r"\b[tg]l\.(load|store|atomic_\w+)\(|\b(load|store)_\w+\(")


def launched_kernels() -> list[tuple[str, JITFunction]]:
    """(module.name, kernel) for every @triton.jit function some module of atom_kernels.triton launches (name[grid])."""
    found = []
    prefix = triton_pkg.__name__ + "."
    for info in pkgutil.walk_packages(triton_pkg.__path__, prefix):  # the op families' subpackages too
        module = importlib.import_module(info.name)
        source = inspect.getsource(module)
        for name, fn in vars(module).items():
            if isinstance(fn, JITFunction) and fn.__module__ == module.__name__ and f"{name}[" in source:
                found.append((f"{info.name.removeprefix(prefix)}.{name}", fn))
    return found


def test_every_launched_kernel_waits_before_touching_memory():
    kernels = launched_kernels()
    assert len(kernels) >= 20, [k for k, _ in kernels]  # the scan found the kernels (it cannot pass by finding none)
    for name, fn in kernels:
        assert "PDL" in fn.arg_names, f"{name} takes no PDL switch: launch it with **pdl(device)"
        body = fn.src[fn.src.index(":\n", fn.src.index("def ")):]
        first_memory_op = MEMORY_OPS.search(body)
        wait = body.find("pdl_prologue(PDL)")
        assert 0 <= wait and (first_memory_op is None or wait < first_memory_op.start()), \
            f"{name}: pdl_prologue(PDL) must come before its first load or store"


def test_pdl_is_off_off_the_gpu_and_by_switch(monkeypatch):
    assert pdl(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setenv("ATOM_PDL", "0")
    assert pdl(torch.device("cuda")) == {"PDL": False}  # the switch is read before any CUDA query


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 64])  # 1: the linear is our GEMV (all Triton); 64: cuBLAS in between
def test_dependent_chain_is_exact_with_pdl(monkeypatch, rows):
    """600 launches where each reads what the one before wrote (SiLU-and-mul, add + RMSNorm, linear): a kernel that
    started reading early would see stale values somewhere in the chain."""
    import atom_kernels
    from atom_kernels.triton._utils import nvidia_sm90

    if not nvidia_sm90(torch.cuda.current_device()):
        pytest.skip("programmatic dependent launch needs compute capability >= 9")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x0 = torch.randn(rows, 2048, device="cuda", generator=gen)
    w = torch.rand(1024, device="cuda", generator=gen) + 0.5
    lin = torch.randn(2048, 1024, device="cuda", generator=gen) * 1024 ** -0.5

    def chain(x):
        for _ in range(200):
            h = atom_kernels.silu_and_mul(x)
            h, _ = atom_kernels.rms_norm(h, w, 1e-6, h)
            x = atom_kernels.linear(h, lin)
        return x

    monkeypatch.setenv("ATOM_PDL", "0")
    want = chain(x0)
    monkeypatch.setenv("ATOM_PDL", "1")
    assert pdl(x0.device)["PDL"]
    assert torch.equal(chain(x0), want)
    x = x0.clone()
    chain(x)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(x)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
