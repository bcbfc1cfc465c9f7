"""The dispatcher: CPU picks atom_kernels' CPU kernels where there is one and the torch reference elsewhere, a
provided kernel before both; the lookup is traceable by torch.compile."""

from __future__ import annotations

import pytest
import torch

import atom_kernels
from atom_kernels import dispatch, reference

CPU_OPS = {"write_kv_cache", "fused_qk_norm_rope_write_kv", "rms_norm", "pack_linear", "linear", "rms_norm_linear",
           "silu_and_mul_linear"}


def test_cpu_uses_the_cpu_kernels_then_the_reference(no_provided_kernels, monkeypatch):
    from atom_kernels.cpu import norm

    assert dispatch.describe("cpu") == {op: "cpu" if op in CPU_OPS else "torch" for op in dispatch.OPS}
    assert dispatch.get("rms_norm", torch.device("cpu")) is norm.rms_norm
    assert dispatch.get("silu_and_mul", torch.device("cpu")) is reference.silu_and_mul
    assert dispatch.backend_for("rms_norm", "cuda") != "cpu"
    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "torch")
    dispatch.reset()
    try:
        assert dispatch.describe("cpu") == {op: "torch" for op in dispatch.OPS}
    finally:
        monkeypatch.undo()
        dispatch.reset()


def test_ops_trace_with_fullgraph_compile():
    # Hosts such as vLLM compile the decoder with fullgraph=True: a graph break would fail them.
    def f(x, w):
        return atom_kernels.silu_and_mul(atom_kernels.rms_norm(x, w, 1e-6))

    dispatch.reset()
    dispatch.resolve("cpu")  # what building a model does, before any host compiles it
    x, w = torch.randn(3, 8), torch.randn(8)
    got = torch.compile(f, fullgraph=True, backend="eager")(x, w)
    torch.testing.assert_close(got, f(x, w))


def test_fp8_linear_is_opaque_to_a_fullgraph_compile():
    """Traced, fp8_linear's reference would dequantize the whole weight in the graph of every step: the library op
    keeps the kernel (the Triton GEMM on the e4m3 weight on GPUs) behind one call; shapes come from its fake."""
    from atom_kernels.reference.fp8 import fp8_linear

    x, w = torch.randn(2, 3, 256), torch.randn(64, 256).to(torch.float8_e4m3fn)
    scale, bias = torch.rand(64, 2) + 0.5, torch.randn(64)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    f = torch.compile(lambda x: atom_kernels.fp8_linear(x, w, scale, 128, 128, None, bias), fullgraph=True,
                      backend=backend)
    torch.testing.assert_close(f(x), fp8_linear(x, w, scale, 128, 128, None, bias))
    called = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert called == ["atom_kernels.fp8_linear"], called  # the op itself, nothing of the reference


def test_aiter_is_refused_until_its_kernels_are_wired(monkeypatch):
    # It used to run the torch reference silently (and turned CUDA graphs off on a GPU).
    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "aiter")
    dispatch.reset()
    try:
        with pytest.raises(ValueError, match="no aiter kernels wired yet"):
            dispatch.backend_for("rms_norm", "cuda")
    finally:
        monkeypatch.delenv("ATOM_KERNEL_BACKEND")
        dispatch.reset()


def test_register_returns_what_it_replaces():
    cpu = torch.device("cpu")
    previous = dispatch.register("silu_and_mul", "torch", "atom_kernels.reference:rms_norm")
    try:
        assert previous == "atom_kernels.reference:silu_and_mul"
        assert dispatch.get("silu_and_mul", cpu) is reference.rms_norm
    finally:
        dispatch.register("silu_and_mul", "torch", previous)
    assert dispatch.get("silu_and_mul", cpu) is reference.silu_and_mul


def test_compiler_traces_fusable_ops_as_their_reference():
    # A device whose kernels are not the reference (as Triton on CUDA): eager calls get them, traced calls get
    # the reference, which the compiler fuses with the ops around it.
    dispatch._RESOLVED.clear()
    try:
        for op in dispatch.OPS:
            dispatch._RESOLVED[(op, "cpu")] = ("triton", atom_kernels.silu_and_mul)  # stands for "not reference"
            dispatch._RESOLVED[(op, "traced")] = ("torch", getattr(reference, op))
        cpu = torch.device("cpu")

        def picks(x):
            return x + int(dispatch.get("rms_norm", cpu) is reference.rms_norm) \
                + 10 * int(dispatch.get("write_kv_cache", cpu) is reference.write_kv_cache)

        assert dispatch.backend("rms_norm", cpu) == "triton"
        assert picks(torch.zeros(())) == 0  # eager: the device's kernels for both
        assert torch.compile(picks, fullgraph=True, backend="eager")(torch.zeros(())) == 1  # traced: rms_norm only
    finally:
        dispatch.reset()


def test_provided_kernels_serve_only_the_device_they_name(monkeypatch, no_provided_kernels):
    # A framework (e.g. vLLM on CPU) provides its own kernels: first choice on that device type only, ours again
    # once removed, and ATOM_KERNEL_BACKEND=torch still forces the reference.
    from atom_kernels.cpu import norm

    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="device_type='cpu'"):
        dispatch.register("rms_norm", "provided", "atom_kernels.reference:silu_and_mul")
    assert dispatch.register("rms_norm", "provided", "atom_kernels.reference:silu_and_mul", device_type="cpu") is None
    try:
        assert dispatch.describe("cpu")["rms_norm"] == "provided"
        assert dispatch.get("rms_norm", cpu) is reference.silu_and_mul
        assert dispatch.backend_for("rms_norm", "cuda") != "provided"
        monkeypatch.setenv("ATOM_KERNEL_BACKEND", "torch")
        dispatch.reset()
        assert dispatch.get("rms_norm", cpu) is reference.rms_norm
        monkeypatch.delenv("ATOM_KERNEL_BACKEND")
    finally:
        assert dispatch.register("rms_norm", "provided", None) == "atom_kernels.reference:silu_and_mul"
    assert "provided" not in dispatch.describe("cpu").values()
    assert dispatch.get("rms_norm", cpu) is norm.rms_norm
    with pytest.raises(ValueError, match="only provided kernels can be removed"):
        dispatch.register("rms_norm", "torch", None)


def test_every_registered_kernel_resolves():
    """Every "module:function" the dispatcher names imports and is callable: a module moved without its
    registration otherwise fails only on the device that picks that backend (the GPU, for the Triton ones)."""
    pytest.importorskip("triton")
    missing = []
    for op, impls in dispatch._IMPLS.items():
        for backend, target in impls.items():
            try:
                assert callable(dispatch._load(target))
            except (ImportError, AttributeError, AssertionError) as e:
                missing.append(f"{op}/{backend}: {target} ({type(e).__name__}: {e})")
    assert not missing, "\n".join(missing)
