"""The FP8 reference ops against computations written out here: per-token-group quantization (scales, partial last
group, static scale), the block-scaled and per-channel GEMMs, and the fp8 experts."""

from __future__ import annotations

import torch

import atom_kernels
from atom_kernels.reference.fp8 import FP8_MAX

E4M3 = torch.float8_e4m3fn


def _groupwise(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize-dequantize each row's groups one by one (the loop the vectorised op must equal) → (x', scales)."""
    out, scales = torch.empty_like(x), []
    for start in range(0, x.shape[-1], group):
        part = x[..., start:start + group]
        s = part.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 448.0
        out[..., start:start + group] = (part / s).to(E4M3).float() * s
        scales.append(s)
    return out, torch.cat(scales, -1)


def test_per_token_group_quantization_with_a_partial_group():
    x = torch.randn(5, 300) * torch.logspace(-2, 2, 300)  # groups of very different ranges
    q, scale = atom_kernels.fp8_quantize(x, 128)
    want, want_scale = _groupwise(x, 128)
    assert q.dtype == E4M3 and scale.shape == (5, 3)
    torch.testing.assert_close(scale, want_scale, rtol=0, atol=0)
    deq = q.float() * scale.repeat_interleave(128, -1)[:, :300]
    torch.testing.assert_close(deq, want, rtol=0, atol=0)
    assert q.float().abs().max() <= FP8_MAX and (q.float().abs().amax(-1) == FP8_MAX).all()


def test_static_scale_and_zero_rows():
    x = torch.zeros(2, 128)
    x[1] = torch.linspace(-3, 3, 128)
    q, scale = atom_kernels.fp8_quantize(x, 128)
    assert torch.isfinite(scale).all() and (q[0].float() == 0).all()
    q, scale = atom_kernels.fp8_quantize(x, 128, torch.tensor([0.01]))
    assert scale.shape == (1,) and float(scale) == float(torch.tensor(0.01))
    torch.testing.assert_close(q.float() * 0.01, (x / 0.01).to(E4M3).float() * 0.01)


def _blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-D weight quantized per block as the releases store it → (fp8, scale_inv [ceil(N/bn), ceil(K/bk)])."""
    bn, bk = block
    n, k = w.shape
    scale = torch.empty(-(-n // bn), -(-k // bk))
    q = torch.empty(n, k, dtype=E4M3)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            scale[i, j] = tile.abs().max() / 448.0
            q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (tile / scale[i, j]).to(E4M3)
    return q, scale


def test_block_scaled_gemm_equals_dequantized_matmul():
    torch.manual_seed(0)
    x, w = torch.randn(7, 320), torch.randn(200, 320)
    q, scale_inv = _blocks(w, (128, 128))
    w_deq = torch.stack([torch.stack([q[n, c].float() * scale_inv[n // 128, c // 128] for c in range(320)])
                         for n in range(200)])
    row_scales = scale_inv.repeat_interleave(128, 0)[:200]  # our layout: one block row per weight row
    got = atom_kernels.fp8_linear(x, q, row_scales, 128, 128)
    want = _groupwise(x, 128)[0] @ w_deq.T
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    # a scale ignored or a block of scales shifted gives another result
    assert not torch.allclose(atom_kernels.fp8_linear(x, q, torch.ones_like(row_scales), 128, 128), want)
    assert not torch.allclose(atom_kernels.fp8_linear(x, q, row_scales.roll(1, 1), 128, 128), want, atol=1e-2)


def test_per_channel_gemm_with_dynamic_and_static_activations():
    torch.manual_seed(1)
    x, w, bias = torch.randn(4, 96, dtype=torch.bfloat16), torch.randn(48, 96), torch.randn(48)
    scale = w.abs().amax(1, keepdim=True) / 448.0
    q = (w / scale).to(E4M3)
    w_deq = q.float() * scale
    got = atom_kernels.fp8_linear(x, q, scale, 96, 96, bias=bias)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), (_groupwise(x.float(), 96)[0] @ w_deq.T + bias).bfloat16().float())
    static = torch.tensor([0.02])
    got = atom_kernels.fp8_linear(x.float(), q, scale, 96, 0, input_scale=static)
    torch.testing.assert_close(got, ((x.float() / 0.02).to(E4M3).float() * 0.02) @ w_deq.T)
    torch.testing.assert_close(atom_kernels.fp8_linear(x.float(), q, scale, 96, 0), x.float() @ w_deq.T)


def test_fp8_experts_equal_the_experts_on_dequantized_weights():
    torch.manual_seed(2)
    e, h, i, t = 4, 64, 48, 6
    w13, w2 = torch.randn(e, 2 * i, h), torch.randn(e, h, i)
    s13, s2 = w13.abs().amax(-1, keepdim=True) / 448, w2.abs().amax(-1, keepdim=True) / 448
    q13, q2 = (w13 / s13).to(E4M3), (w2 / s2).to(E4M3)
    hidden, weights = torch.randn(t, h), torch.rand(t, 2)
    ids = torch.tensor([[0, 1], [1, 2], [3, 0], [2, 3], [0, 2], [1, 3]])
    got = atom_kernels.fp8_fused_moe(hidden, q13, q2, s13, s2, weights, ids, h, 32)
    want = torch.zeros(t, h)
    for tok in range(t):
        for k in range(2):
            ex = int(ids[tok, k])
            gate, up = (_groupwise(hidden[tok:tok + 1], 32)[0] @ (q13[ex].float() * s13[ex]).T).chunk(2, -1)
            act = torch.nn.functional.silu(gate) * up
            want[tok] += weights[tok, k] * (_groupwise(act, 32)[0] @ (q2[ex].float() * s2[ex]).T)[0]
    # (a summation order apart: an activation on an fp8 rounding boundary may land in the neighbouring value)
    torch.testing.assert_close(got, want, rtol=5e-3, atol=5e-3)
