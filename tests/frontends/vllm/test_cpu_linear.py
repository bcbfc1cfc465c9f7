"""vLLM's prepacked CPU GEMM as atom_kernels' "provided" linear (atom_frontends.vllm.cpu_linear): F.linear's results
through vLLM's own kernel (no aten matmul runs), for our tensor-parallel layers after prepare_weights, eager and
traced by torch.compile (the graph calls vLLM's op, as vLLM's own compiled layers do).

Tolerances: float32 within torch's float32 defaults (rtol 1.3e-6, atol 1e-5: oneDNN and torch's GEMM sum in
different orders); bfloat16 within one bf16 rounding step (rtol 1.6e-2) plus atol 1e-2 for outputs near zero.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("vllm")

import atom_kernels  # noqa: E402
from atom_core.layers.linear import (  # noqa: E402
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from atom_core.loader import prepare_weights  # noqa: E402
from atom_core.platform import Platform  # noqa: E402

ATEN_GEMMS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"}
TOL = {torch.float32: dict(rtol=1.3e-6, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


class _OpLog(TorchDispatchMode):
    """The names of the ops that run below the Python dispatcher (aten ops, vLLM's torch.ops._C ops)."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.name())
        return func(*args, **(kwargs or {}))


def _ran_vllm_gemm(names: set[str]) -> bool:
    return not names & ATEN_GEMMS and any(n.startswith("_C::") for n in names)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_vllm_linear_matches_f_linear(vllm_kernels, dtype, bias, rows):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 160, generator=g).to(dtype)
    b = torch.randn(96, generator=g).to(dtype) if bias else None
    b_ref = None if b is None else b.clone()  # vLLM's packing may turn b to float32 in place (its sgl-kernel path)
    packed = atom_kernels.pack_linear(weight, b)
    assert packed is not None
    # a column slice of a wider activation (as a fused projection's q part: rows strided), and a 3-D input
    wide = torch.randn(rows, 224, generator=g).to(dtype)
    for x in (wide[:, :160], torch.randn(2, rows, 160, generator=g).to(dtype)):
        with _OpLog() as log:
            got = atom_kernels.linear(x, weight, b, packed)
        assert _ran_vllm_gemm(log.names), log.names
        torch.testing.assert_close(got, F.linear(x, weight, b_ref), **TOL[dtype])


def _layers(platform: Platform, g: torch.Generator) -> list[torch.nn.Module]:
    """Our layers with random weights, loaded through their weight_loaders (this rank's shards)."""
    qkv = QKVParallelLinear(64, 16, 4, 2, bias=True, platform=platform)
    merged = MergedColumnParallelLinear(64, [48, 48], platform=platform)
    column = ColumnParallelLinear(64, 80, bias=True, platform=platform)
    row = RowParallelLinear(96, 64, bias=True, platform=platform)
    for shard in ("q", "k", "v"):
        qkv.weight_loader(qkv.weight, torch.randn(64 if shard == "q" else 32, 64, generator=g), shard)
        qkv.weight_loader(qkv.bias, torch.randn(64 if shard == "q" else 32, generator=g), shard)
    for shard in (0, 1):
        merged.weight_loader(merged.weight, torch.randn(48, 64, generator=g), shard)
    column.weight_loader(column.weight, torch.randn(80, 64, generator=g))  # full checkpoint tensors
    column.weight_loader(column.bias, torch.randn(80, generator=g))
    row.weight_loader(row.weight, torch.randn(64, 96, generator=g))
    row.weight_loader(row.bias, torch.randn(64, generator=g))
    return [qkv, merged, column, row]


def _reference(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


@pytest.mark.parametrize("tp_rank", [0, 1])
def test_tensor_parallel_layers_pack_their_shards(vllm_kernels, tp_rank):
    platform = Platform("test", torch.device("cpu"), tp_rank=tp_rank, tp_size=2,
                        all_reduce=lambda t: t, all_gather=lambda t, dim=-1: t)  # one rank's partial result
    layers = _layers(platform, torch.Generator().manual_seed(0))
    assert all(layer.packed is None for layer in layers)  # until loading is done
    prepare_weights(torch.nn.ModuleList(layers))
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(1))
    for layer in layers:
        assert layer.packed is not None
        inp = x[:, : layer.weight.shape[1]]
        with _OpLog() as log:
            got = layer(inp)
        assert _ran_vllm_gemm(log.names), (type(layer).__name__, log.names)
        torch.testing.assert_close(got, _reference(layer, inp), **TOL[torch.float32])


def test_compiled_layers_call_vllm_gemm(vllm_kernels):
    """Traced by dynamo (fullgraph, as vLLM compiles), the layers' GEMMs are vLLM's op in the graph, and the
    graph, run through AOT autograd with fake tensors (what inductor does first), gives F.linear's results."""
    from torch._dynamo.backends.debugging import aot_eager

    layers = torch.nn.ModuleList(_layers(Platform("test", torch.device("cpu")), torch.Generator().manual_seed(2)))
    prepare_weights(layers)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    def forward(x):
        return [layer(x[:, : layer.weight.shape[1]]) for layer in layers]

    x = torch.randn(9, 96, generator=torch.Generator().manual_seed(3))
    got = torch.compile(forward, fullgraph=True, backend=capture)(x)
    (graph,) = graphs
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    gemms = [t for t in targets if "mm" in t or "linear" in t]  # F.linear traces as "<built-in function linear>"
    assert len(gemms) == len(layers) and all(t.startswith("_C.") for t in gemms), targets
    for layer, y in zip(layers, got):
        torch.testing.assert_close(y, _reference(layer, x[:, : layer.weight.shape[1]]), **TOL[torch.float32])


def test_unpacked_layer_and_forced_reference_use_f_linear(vllm_kernels, monkeypatch):
    """A layer never prepared (no packed form) and ATOM_KERNEL_BACKEND=torch both run aten's GEMM, exactly."""
    from atom_kernels import dispatch

    layer = _layers(Platform("test", torch.device("cpu")), torch.Generator().manual_seed(4))[2]
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5))
    with _OpLog() as log:
        got = layer(x)
    assert "aten::addmm" in log.names and torch.equal(got, _reference(layer, x))
    prepare_weights(layer)
    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "torch")
    dispatch.reset()
    try:
        with _OpLog() as log:
            got = layer(x)
        assert "aten::addmm" in log.names and torch.equal(got, _reference(layer, x))
    finally:
        monkeypatch.delenv("ATOM_KERNEL_BACKEND")
        dispatch.reset()
