"""Per-channel FP8 weights with per-token activations (compressed-tensors "FP8-Dynamic": block_k = act_group = K) in
the Triton fp8_linear (atom_kernels/triton/fp8_linear.py) vs the torch reference, under Triton's CPU interpreter: the
GEMV (each split-K layout) and the tile kernel (TMA and pointer loads) walking K in 128-column tiles under the one
scale, K of one tile and of several with a partial last one, bias, float32 and bf16, tokens and channels whose scales
are 2^-3..2^3 apart; the prologue ops (a norm or SiLU-and-mul quantizing per token) too. Canaries: the channel
scales moved by one row, and the token scales read per 128 columns (the block format's rule), must miss. Marked gpu:
model shapes at M = 1 to 4096 (the GEMV, the tile kernel and torch's rowwise scaled_mm), the probe's answer, a bias,
and a misplaced channel scale."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.interpreter import run_under_interpreter  # noqa: E402

CASES = ((1, 70, 300, "float32", False), (5, 64, 96, "bfloat16", True), (17, 40, 256, "float32", True),
         (40, 100, 304, "float32", True), (33, 48, 200, "bfloat16", False))  # (M, N, K, dtype, bias)


def _operands(m, n, k, dtype, device="cpu", seed=0):
    """x [m, k] with per-token magnitudes 2^-3..2^3, e4m3 weight [n, k], channel scales [n, 1] likewise spread."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=device) * torch.randint(-3, 4, (m, 1), generator=g, device=device).exp2()
    wq = torch.randn(n, k, generator=g, device=device).to(torch.float8_e4m3fn)
    scale = torch.randint(-3, 4, (n, 1), generator=g, device=device).exp2() * 1e-2
    bias = torch.randn(n, generator=g, device=device)
    return x.to(dtype), wq, scale, bias.to(dtype)


def _rel_l2(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def per_channel_checks() -> None:
    import torch

    from atom_kernels.reference.fp8 import fp8_linear as reference
    from atom_kernels.triton.fp8_gemv import fp8_gemv
    from atom_kernels.triton.fp8_linear import fp8_linear, gemm, path

    for m, n, k, dtype, with_bias in CASES:
        x, wq, scale, bias = _operands(m, n, k, getattr(torch, dtype), seed=m)
        bias = bias if with_bias else None
        want = reference(x, wq, scale, k, k, None, bias)
        tol, at = (1e-2 if dtype == "bfloat16" else 1e-5), (m, n, k, dtype)
        got = fp8_linear(x, wq, scale, k, k, None, bias)
        assert got.dtype == x.dtype and got.shape == (m, n) and _rel_l2(got, want) <= tol, (at, _rel_l2(got, want))
        if m <= 32:
            for splits, per in ((1, 3), (3, 1), (2, 2)):  # in 128-column K tiles
                got = fp8_gemv(x, wq, scale, k, bias, splits=min(splits, -(-k // 128)), per=per)
                assert _rel_l2(got, want) <= tol, (at, splits, per, _rel_l2(got, want))
        else:
            assert path(x, wq, k, bias, 0) == "tile"  # off CUDA: no cuBLAS probe
            for tma in (False, True) if k % 16 == 0 else (False,):
                got = gemm(x, wq, scale, k, bias, (16, 32, 4, 1, 1), tma)
                assert _rel_l2(got, want) <= tol, (at, tma, _rel_l2(got, want))
        moved = fp8_linear(x, wq, scale.roll(1, 0), k, k, None, bias)
        assert _rel_l2(moved, want) > 0.1, (at, "a moved channel scale went unnoticed")
        if k > 128:  # the block format's rule on these weights: activation groups of 128 columns, another answer
            blocks = scale.repeat(1, -(-k // 128))
            grouped = fp8_linear(x, wq, blocks, 128, 128, None, bias)
            assert _rel_l2(grouped, want) > tol, (at, "per-token quantization indistinguishable from per-group")
    print("per-channel checks passed")


def static_checks() -> None:
    """A static per-tensor input scale (compressed-tensors' static activations) with per-channel weights and with
    128-column weight blocks: the GEMV (each split) and the tile kernel (TMA and pointer loads), float32 within 1e-5
    and bf16 within 1e-2 of the reference; the scales are read where dynamic ones are, M-major for cuBLAS too."""
    import torch

    from atom_kernels.reference.fp8 import fp8_linear as reference
    from atom_kernels.triton.fp8_gemv import gemv_quantized
    from atom_kernels.triton.fp8_linear import fp8_linear, gemm_quantized, quantize

    static = torch.tensor([0.03])
    for m, n, k, dtype, with_bias in CASES:
        x, wq, scale, bias = _operands(m, n, k, getattr(torch, dtype), seed=m)
        x = x / x.abs().amax(1, keepdim=True)  # within the static scale's range (448 * 0.03)
        bias, tol = bias if with_bias else None, (1e-2 if dtype == "bfloat16" else 1e-5)
        for block, ws in ((k, scale), (128, scale.repeat(1, -(-k // 128)))):
            want = reference(x, wq, ws, block, 0, static, bias)
            got = fp8_linear(x, wq, ws, block, 0, static, bias)
            assert _rel_l2(got, want) <= tol, ((m, n, k, dtype, block), _rel_l2(got, want))
            xq, xs = quantize(x, block, ws.shape[1], static, m_major=False)
            if m <= 32:
                got = gemv_quantized(xq, xs, wq, ws, block, bias, x.dtype, splits=min(2, -(-k // 128)), per=2)
            else:
                got = gemm_quantized(xq, xs, wq, ws, block, bias, x.dtype, (16, 32, 4, 1, 1), k % 16 == 0)
            assert _rel_l2(got, want) <= tol, ((m, n, k, dtype, block, "forced"), _rel_l2(got, want))
        xq_m, xs_m = quantize(x, 128, 3, static, m_major=True)
        assert xs_m.stride() == (1, m) and (xs_m == 0.03).all() and torch.equal(xq_m.float(), xq.float())
    print("static checks passed")


def prologue_checks() -> None:
    """The quantizing norm and SiLU-and-mul kernels with one group per row (300 columns: the group is the padded
    block) == their separate Triton kernels + fp8_quantize_rows, bit for bit; rms_norm_fp8_linear and
    silu_and_mul_fp8_linear per token vs the reference composites, float32."""
    import torch

    from atom_kernels.reference import fused_linear as reference
    from atom_kernels.triton.activation import silu_and_mul
    from atom_kernels.triton.fp8_prologue import (
        rms_norm_fp8_linear,
        rms_norm_quantize,
        silu_and_mul_fp8_linear,
        silu_and_mul_quantize,
    )
    from atom_kernels.triton.fp8_quant import fp8_quantize_rows
    from atom_kernels.triton.norm import rms_norm

    for m, n, k in ((3, 64, 300), (40, 72, 256)):
        x, wq, scale, bias = _operands(m, n, k, torch.float32, seed=k)
        gate_up = torch.cat([x, x.flip(1) * 0.5], 1)
        norm_w = 1 + torch.rand(k, generator=torch.Generator().manual_seed(1))
        q, s, _ = rms_norm_quantize(x, None, norm_w, 1e-6, k, False)
        want_q, want_s = fp8_quantize_rows(rms_norm(x, norm_w, 1e-6), k)
        assert s.shape == (m, 1) and torch.equal(s, want_s) and torch.equal(q.float(), want_q.float()), (m, k)
        q, s = silu_and_mul_quantize(gate_up, k, False)
        want_q, want_s = fp8_quantize_rows(silu_and_mul(gate_up), k)
        assert torch.equal(s, want_s) and torch.equal(q.float(), want_q.float()), (m, k)
        args = (wq, scale, k, k, None, bias)
        got, _ = rms_norm_fp8_linear(x, x * 0.25, norm_w, 1e-6, *args)
        want, _ = reference.rms_norm_fp8_linear(x, x * 0.25, norm_w, 1e-6, *args)
        assert _rel_l2(got, want) <= 1e-5, (m, k, _rel_l2(got, want))
        got = silu_and_mul_fp8_linear(gate_up, *args)
        assert _rel_l2(got, reference.silu_and_mul_fp8_linear(gate_up, *args)) <= 1e-5, (m, k)
        moved = silu_and_mul_fp8_linear(gate_up, wq, scale.roll(1, 0), k, k, None, bias)
        assert _rel_l2(moved, got) > 0.1
    print("per-channel prologue checks passed")


def test_per_channel_fp8_linear_under_the_interpreter():
    code = "from tests.kernels.test_triton_fp8_per_channel import per_channel_checks; per_channel_checks()"
    run_under_interpreter(code, "per-channel checks passed")


def test_static_input_scale_under_the_interpreter():
    code = "from tests.kernels.test_triton_fp8_per_channel import static_checks; static_checks()"
    run_under_interpreter(code, "static checks passed")


def test_per_channel_fp8_prologue_ops_under_the_interpreter():
    code = "from tests.kernels.test_triton_fp8_per_channel import prologue_checks; prologue_checks()"
    run_under_interpreter(code, "per-channel prologue checks passed")


GPU_SHAPES = ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 12288), (5120, 2048))  # (N, K)


def _gpu_case(m: int, n: int, k: int):
    """bf16 x [m, k]; e4m3 weight [n, k] quantized per channel as compressed-tensors does (amax / 448 per row), its
    rows' magnitudes spread over 2^-3..2^3 (so are the channel scales: a scale moved by one row shows; drawn alike,
    rows' amax / 448 differ by ~10% and a moved scale moved the output by that little on the H100)."""
    import torch

    from atom_kernels.reference.fp8 import fp8_linear as reference
    from tests.fp8_checkpoints import quantize

    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    w = torch.randn(n, k, device="cuda", generator=g) * k**-0.5
    w *= torch.randint(-3, 4, (n, 1), device="cuda", generator=g).exp2()
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    wq, scale, _ = quantize(w, "channel")
    scale = scale.reshape(n, 1).float().contiguous()
    return x, wq, scale, reference(x, wq, scale, k, k)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32, 40, 256, 4096])
@pytest.mark.parametrize("n,k", GPU_SHAPES)
def test_per_channel_fp8_linear_on_gpu(n, k, m):
    """bf16 within 1% relative L2 of the reference (every row within 3%); a channel scale moved by one row fails."""
    import torch

    from atom_kernels.triton.fp8_linear import fp8_linear, path

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x, wq, scale, want = _gpu_case(m, n, k)
    print(f"M {m} N {n} K {k}: {path(x, wq, k, None, 0)}")
    got = fp8_linear(x, wq, scale, k, k)
    diff = got.float() - want.float()
    rows = (diff.norm(dim=-1) / want.float().norm(dim=-1).clamp(min=1e-30)).max().item()
    assert _rel_l2(got, want) <= 1e-2 and rows <= 3e-2, (_rel_l2(got, want), rows)
    assert _rel_l2(fp8_linear(x, wq, scale.roll(1, 0), k, k), want) > 0.1


@pytest.mark.gpu
def test_rowwise_scaled_mm_is_found_on_hopper_with_bias():
    """On sm_90 the rowwise probe must find torch's GEMM for bf16 (printed: the bias answer), and a biased call at
    M = 4096 takes it or the tile kernel, matching the reference either way."""
    import torch

    from atom_kernels.reference.fp8 import fp8_linear as reference
    from atom_kernels.triton import fp8_cublas
    from atom_kernels.triton.fp8_linear import fp8_linear, path

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU")
    s = fp8_cublas.support(torch.device("cuda"), torch.bfloat16, rowwise=True)
    print(f"rowwise support: {s}")
    assert s.aligned, s.note
    x, wq, scale, _ = _gpu_case(4096, 4096, 4096)
    bias = torch.randn(4096, device="cuda").to(torch.bfloat16)
    print(f"biased path: {path(x, wq, 4096, bias, 0)}")
    got, want = fp8_linear(x, wq, scale, 4096, 4096, None, bias), reference(x, wq, scale, 4096, 4096, None, bias)
    assert _rel_l2(got, want) <= 1e-2
