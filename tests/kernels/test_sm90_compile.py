"""The FP8, MoE, decode GEMV, paged attention, MLA (the Gluon Hopper kernels too), KV write, rotary and sampling Triton
kernels compile for Hopper (sm_90) on a machine without a GPU: Triton's own JIT, with the specializations a real
call makes (alignment and divisibility read off the arguments), down to a cubin by the ptxas that ships in the
triton wheel, and each fits an H100/H200 SM's shared memory. Nothing runs: a compile-only Triton driver answers the
JIT's device questions and every launch is a warm-up (the outputs stay garbage), so this catches what the
interpreter cannot (a construct the GPU backend refuses, a register or shared-memory budget blown by a config) and
says nothing about values, which the interpreter checks and the GPU tests do. Launch switches are an H100's: PDL on
(every kernel's wait, and the decode GEMVs' L2 prefetch before it, found in their PTX); the cuBLAS GEMMs are off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from tests.interpreter import REPO  # noqa: E402

SM90_SHARED = 227 * 1024  # bytes of shared memory one block may take on sm_90 (the opt-in maximum)


def compile_only_driver():
    """A Triton driver that compiles for sm_90 and launches nothing: JITFunction.run always warms up."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class CompileOnly(DriverBase):
        @classmethod
        def is_active(cls):
            return True

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

        def get_device_interface(self):
            return torch.cuda

        def get_benchmarker(self):
            raise RuntimeError("compile only: nothing is timed")

        def map_python_to_cpp_type(self, ty):
            raise RuntimeError("compile only: nothing is launched")

    compiled = []
    run = JITFunction.run

    def warm_up(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel.metadata.shared, len(kernel.asm["cubin"]),
                         "prefetch.global.L2" in kernel.asm["ptx"]))
        return kernel

    JITFunction.run = warm_up
    driver.set_active(CompileOnly())
    return compiled


def pdl_on() -> None:
    """Every kernel module's pdl() answers as on an H100 (PDL on; so the GEMVs' prefetch too): the launch switches
    the GPU compiles with. Call after the kernel modules are imported (they hold pdl by name)."""
    import sys

    from atom_kernels.triton import _utils

    def on(device):
        return {"PDL": True, "launch_pdl": True}

    original = _utils.pdl
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("atom_kernels") and getattr(module, "pdl", None) is original:
            module.pdl = on


def _calls():
    """(what, thunk) for each kernel variant: the FP8 linear's GEMV (block, per channel, bias), tile GEMM (TMA and
    pointer loads), quantizer, prologue ops, the bf16 and FP8 fused MoE (decode GEMVs and block GEMMs), and the bf16
    decode linear with its fused norm / SiLU-and-mul, RMSNorm and SiLU-and-mul; then _attention_calls."""
    import torch

    from atom_kernels.triton import activation, fused_linear, linear, norm
    from atom_kernels.triton.fp8_linear import fp8_linear, gemm
    from atom_kernels.triton.fp8_prologue import rms_norm_fp8_linear, silu_and_mul_fp8_linear
    from atom_kernels.triton.moe import fused_moe
    from atom_kernels.triton.moe.fp8 import fp8_fused_moe

    e4m3 = torch.float8_e4m3fn
    calls = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m in (1, 16, 32, 64, 4096) if dtype == torch.bfloat16 else (1, 64):  # fp16 / fp32: their dots
            for n, k, block in ((2048, 4096, 128), (4096, 12288, 128), (4096, 4096, 4096), (96, 300, 300)):
                x, w = torch.randn(m, k, dtype=dtype), torch.empty(n, k, dtype=e4m3)
                s, bias = torch.ones(n, -(-k // block)), torch.zeros(n, dtype=dtype)
                calls.append((f"fp8_linear {dtype} M {m} {n}x{k}/{block}",
                              lambda x=x, w=w, s=s, b=block, bias=bias: fp8_linear(x, w, s, b, b, None, bias)))
                if m == 1:
                    calls.append((f"rms_norm_fp8_linear {dtype} {n}x{k}/{block}", lambda x=x, w=w, s=s, b=block:
                                  rms_norm_fp8_linear(x, x, torch.ones(x.shape[1], dtype=x.dtype), 1e-6, w, s, b, b)))
                    calls.append((f"silu_and_mul_fp8_linear {dtype} {n}x{k}/{block}", lambda x=x, w=w, s=s, b=block:
                                  silu_and_mul_fp8_linear(torch.cat([x, x], 1), w, s, b, b)))
        x, w, s = torch.randn(300, 4096, dtype=dtype), torch.empty(2048, 4096, dtype=e4m3), torch.ones(2048, 32)
        calls.append((f"tile GEMM pointer loads {dtype}", lambda x=x, w=w, s=s: gemm(x, w, s, 128, None, tma=False)))
    experts, hidden, inter, top_k = 8, 1024, 512, 2
    for t in (1, 32, 512):
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(t, hidden, dtype=dtype)
            weights, ids = torch.rand(t, top_k), torch.randint(0, experts, (t, top_k), dtype=torch.int32)
            w13 = torch.empty(experts, 2 * inter, hidden, dtype=e4m3)
            w2 = torch.empty(experts, hidden, inter, dtype=e4m3)
            s13, s2 = torch.ones(experts, 2 * inter, hidden // 128), torch.ones(experts, hidden, inter // 128)
            calls.append((f"fp8_fused_moe {dtype} T {t}", lambda x=x, a=(w13, w2, s13, s2, weights, ids):
                          fp8_fused_moe(x, *a, 128, 128)))
            b13 = torch.randn(experts, 2 * inter, hidden, dtype=dtype)
            b2 = torch.randn(experts, hidden, inter, dtype=dtype)
            calls.append((f"fused_moe {dtype} T {t}", lambda x=x, a=(b13, b2, weights, ids): fused_moe(x, *a)))
    for dtype in (torch.bfloat16, torch.float32):
        for m, n, k in ((1, 2048, 1024), (1, 6144, 4096)):  # the bf16 GEMV: one row (more: torch)
            x, w, nw = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype), torch.ones(k, dtype=dtype)
            calls.append((f"linear {dtype} M {m} {n}x{k}", lambda x=x, w=w: linear.linear(x, w)))
            calls.append((f"rms_norm_linear {dtype} M {m}", lambda x=x, w=w, nw=nw:
                          fused_linear.rms_norm_linear(x, x, nw, 1e-6, w)))
            calls.append((f"silu_and_mul_linear {dtype} M {m}", lambda x=x, w=w:
                          fused_linear.silu_and_mul_linear(torch.cat([x, x], 1), w)))
            calls.append((f"rms_norm {dtype} M {m}", lambda x=x, nw=nw: norm.rms_norm(x, nw, 1e-6, x)))
            calls.append((f"silu_and_mul {dtype} M {m}", lambda x=x: activation.silu_and_mul(torch.cat([x, x], 1))))
    return calls + _attention_calls() + _mla_calls()


def _attention_calls():
    """Paged attention (decode and prefill, bf16 and fp8 e4m3 KV with scales), the KV write, rotary and sampling."""
    import torch

    from atom_kernels.triton.attention import paged_attention
    from atom_kernels.triton.kv_cache import write_kv_cache
    from atom_kernels.triton.rotary import rotary
    from atom_kernels.triton.sampling import sample_tokens

    heads, kv_heads, d, block, blocks = 16, 8, 128, 16, 64
    tables = torch.arange(4 * 8, dtype=torch.int32).view(4, 8)
    decode = (torch.tensor([100, 50, 7, 128], dtype=torch.int32), torch.arange(5, dtype=torch.int32))
    prefill = (torch.tensor([10, 30], dtype=torch.int32), torch.tensor([0, 10, 40], dtype=torch.int32))
    calls = []
    for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):
        caches = [torch.zeros(blocks, block, kv_heads, d, dtype=kv_dtype) for _ in range(2)]
        scales = (torch.ones(1), torch.ones(1)) if kv_dtype != torch.bfloat16 else (None, None)
        q, k = torch.randn(40, heads, d, dtype=torch.bfloat16), torch.randn(4, kv_heads, d, dtype=torch.bfloat16)
        calls.append((f"paged_attention decode KV {kv_dtype}", lambda c=caches, s=scales, q=q: paged_attention(
            q[:4], *c, tables, *decode, d**-0.5, k_scale=s[0], v_scale=s[1], max_query_len=1, num_decodes=4)))
        calls.append((f"paged_attention prefill KV {kv_dtype}", lambda c=caches, s=scales, q=q: paged_attention(
            q, *c, tables[:2], *prefill, d**-0.5, k_scale=s[0], v_scale=s[1], max_query_len=30, num_decodes=0)))
        calls.append((f"write_kv_cache {kv_dtype}", lambda c=caches, s=scales, k=k: write_kv_cache(
            k, k, *c, torch.tensor([0, 17, 33, 900]), *s)))
    q, k = torch.randn(4, heads, d, dtype=torch.bfloat16), torch.randn(4, kv_heads, d, dtype=torch.bfloat16)
    calls.append(("rotary", lambda: rotary(torch.arange(4), q, k, torch.randn(4096, d))))
    calls.append(("sample_tokens", lambda: sample_tokens(torch.randn(4, 151936, dtype=torch.bfloat16),
                                                         torch.tensor([0.0, 1.0, 0.5, 0.0]), torch.arange(4))))
    return calls


def _mla_calls(force_gluon: bool = False):
    """MLA decode (16 heads: the Gluon few-heads kernel; 128: the Gluon wgmma kernel) and prefill, bf16 and fp8
    latent caches; the host's answers of an H100/H200 (Hopper, 227 KB of shared memory) patched in where it would
    ask the device. force_gluon: the Gluon kernels even where their gate is closed (a triton not yet run on a GPU)."""
    import torch

    from atom_kernels.triton.mla import decode, mla_attention

    decode.hopper = lambda device: force_gluon or decode.GLUON_HOPPER
    decode.shared_memory = lambda device: SM90_SHARED
    tables = torch.arange(32, dtype=torch.int32).view(4, 8)
    calls = []
    for heads in (16, 128):
        for cache_dtype in (torch.bfloat16, torch.float8_e4m3fn):
            cache = torch.zeros(64, 64, 576, dtype=cache_dtype)
            scale = torch.ones(1) if cache_dtype != torch.bfloat16 else None
            q = torch.randn(40, heads, 576, dtype=torch.bfloat16)
            calls.append((f"mla decode {heads} heads {cache_dtype}", lambda q=q, c=cache, s=scale: mla_attention(
                q[:4], c, tables, torch.tensor([100, 50, 7, 128], dtype=torch.int32),
                torch.arange(5, dtype=torch.int32), 0.1, 512, s, max_query_len=1, num_decodes=4)))
            calls.append((f"mla prefill {heads} heads {cache_dtype}", lambda q=q, c=cache, s=scale: mla_attention(
                q, c, tables[:2], torch.tensor([10, 30], dtype=torch.int32),
                torch.tensor([0, 10, 40], dtype=torch.int32), 0.1, 512, s, max_query_len=30, num_decodes=0)))
    return calls


def _compile_each(calls, compiled: list) -> None:
    """Make each (what, thunk) call with PDL on (pdl_on), naming the call that fails or compiles no Triton kernel."""
    pdl_on()
    for what, call in calls:
        before = len(compiled)
        try:
            call()
        except Exception as e:
            raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e
        assert len(compiled) > before, f"{what}: no Triton kernel was compiled (a path off the kernels?)"


def compile_all() -> None:
    compiled = compile_only_driver()
    _compile_each(_calls(), compiled)
    too_big = sorted({(name, shared) for name, shared, *_ in compiled if shared > SM90_SHARED})
    assert not too_big, f"kernels over sm_90's {SM90_SHARED} bytes of shared memory: {too_big}"
    assert all(size > 0 for _, _, size, _ in compiled)
    gemvs = [fetch for name, *_, fetch in compiled if name == "_fp8_gemv_kernel"]
    assert gemvs and all(gemvs), "the FP8 decode GEMV compiled without its L2 prefetch"
    names = sorted({name for name, *_ in compiled})
    from atom_kernels.triton.mla.decode import GLUON_HOPPER

    assert not GLUON_HOPPER or {"_mla_decode_wgmma_kernel", "_mla_decode_few_heads_kernel"} <= set(names), names
    print(f"{len(compiled)} launches compiled for sm_90: {', '.join(names)}")
    print("sm90 compile checks passed")


def compile_gluon_mla() -> None:
    """The Gluon MLA decode kernels alone, their gate forced open: they compile under this triton (CI's sglang
    session runs it under SGLang's 3.8): a triton not yet run on a GPU is checked before its gate opens."""
    compiled = compile_only_driver()
    _compile_each([(what, call) for what, call in _mla_calls(force_gluon=True) if "decode" in what], compiled)
    names = {name for name, *_ in compiled}
    assert {"_mla_decode_wgmma_kernel", "_mla_decode_few_heads_kernel"} <= names, names
    print("gluon mla compiles for sm90")


def _compile_in_subprocess(function: str, marker: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", f"from tests.kernels.test_sm90_compile import {function}; "
                           f"{function}()"], env=env, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    assert marker in done.stdout


def test_triton_kernels_compile_for_sm90():
    _compile_in_subprocess("compile_all", "sm90 compile checks passed")


def test_gluon_mla_kernels_compile_for_sm90_gate_or_not():
    import triton

    pytest.importorskip("triton.experimental.gluon", reason=f"triton {triton.__version__} has no Gluon")
    _compile_in_subprocess("compile_gluon_mla", "gluon mla compiles for sm90")
