"""Linear layers at batch 1: our Triton GEMV (the dispatcher's CUDA linear for one row) vs cuBLAS (F.linear).

Shapes: the layers of Qwen3-0.6B (the native benchmarks' checkpoint) and of an 8B Llama, one row, bf16. Each
launch reads the weight from HBM (L2 flushed before every rep by gpu_times, as in a model whose layers' weights do
not fit in L2). Bandwidth = weight + x + y bytes / time; "of copy" = that over the device copy bandwidth of this
run. Ratio = cuBLAS time / ours (> 1: ours faster), per row and summed over one Qwen3-0.6B layer (qkv, o,
gate_up, down), last. (2-8 rows stay with cuBLAS: a tensor-core variant of the kernel measured 0.95-0.97 of
cuBLAS per Qwen3-0.6B layer there, 2026-11-24.)

    python benchmarks/linear_gemv.py [--sweep] [--out FILE]

--sweep also times a grid of launch configs (block_n, block_k, warps, stages) per Qwen3-0.6B shape, to tune
gemv_config. --fused times the norm / SiLU prologue variants (fused_linear.py) per config against the separate
kernels instead (H100, 2026-11-24, L2 flushed: qkv 8.8 vs 11.3 us, gate_up 10.3 vs 12.7, down 9.2 vs 10.9 with
gemv_config's tiles; an rstd applied after the loop instead of a first pass over x was no faster).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics

import torch
import torch.nn.functional as F
from common import Report, copy_bandwidth, gpu_times, summary

from atom_kernels.triton.linear import gemv, gemv_config

QWEN3_06B = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
             "lm_head": (151936, 1024)}
LLAMA_8B = {"8b qkv": (6144, 4096), "8b o": (4096, 4096), "8b gate_up": (28672, 4096), "8b down": (4096, 14336)}
ROUNDS, REPS = 3, 20
SWEEP = dict(block_n=(2, 4, 8), block_k=(512, 1024, 2048), warps=(4, 8), stages=(1, 3))


def inputs(n: int, k: int, g: torch.Generator):
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5
    return torch.randn(k, device="cuda", dtype=torch.bfloat16, generator=g), w


def check(x, w) -> float:
    """Max |ours - fp32 reference| over max |reference| (bf16 rounding ~4e-3)."""
    want = F.linear(x.float(), w.float())
    return ((gemv(x, w, None).float() - want).abs().max() / want.abs().max()).item()


def table(report: Report, copy_bw: float) -> None:
    say = report.say
    say(f"{'layer':>10} {'N x K':>13}  {'ours us':>8} {'GB/s':>6} {'of copy':>7}  {'cuBLAS us':>9} {'GB/s':>6}  "
        f"{'err':>7}  {'cuBLAS/ours':>11}")
    g = torch.Generator(device="cuda").manual_seed(0)
    layer = [0.0, 0.0]  # one Qwen3-0.6B layer: ours, cuBLAS
    for name, (n, k) in {**QWEN3_06B, **LLAMA_8B}.items():
        x, w = inputs(n, k, g)
        fns = {"ours": functools.partial(gemv, x, w, None), "cublas": functools.partial(F.linear, x, w)}
        times, _ = gpu_times(fns, ROUNDS, REPS)
        ours, cublas = summary(times["ours"], ROUNDS)[0], summary(times["cublas"], ROUNDS)[0]
        nbytes = 2 * (n * k + k + n)
        if name in QWEN3_06B and name != "lm_head":
            layer[0] += ours
            layer[1] += cublas
        say(f"{name:>10} {n:>6} x {k:>5}  {ours * 1e3:>8.1f} {nbytes / ours / 1e6:>6.0f} "
            f"{nbytes / ours / 1e6 / (copy_bw / 1e9):>7.2f}  {cublas * 1e3:>9.1f} {nbytes / cublas / 1e6:>6.0f}  "
            f"{check(x, w):>7.1e}  {cublas / ours:>11.2f}")
    say()
    say(f"one Qwen3-0.6B layer (qkv + o + gate_up + down): ours {layer[0] * 1e3:.1f} us, "
        f"cuBLAS {layer[1] * 1e3:.1f} us")
    say(f"cuBLAS/ours per Qwen3-0.6B layer: {layer[1] / layer[0]:.2f}")


def sweep(report: Report) -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    for name, (n, k) in QWEN3_06B.items():
        x, w = inputs(n, k, g)
        cfgs = [c for c in itertools.product(*SWEEP.values()) if n // c[0] >= 32 and c[1] <= k]
        times, failed = gpu_times({c: functools.partial(gemv, x, w, None, c) for c in cfgs}, 2, 10)
        best = sorted((statistics.median(t), c) for c, t in times.items())[:5]
        default = gemv_config(n, k)
        report.say(f"{name}: default {default} {statistics.median(times[default]) * 1e3:.1f} us; best "
                   + "; ".join(f"{c} {t * 1e3:.1f} us" for t, c in best) + (f" ({len(failed)} failed)" * bool(failed)))


FUSED_SWEEP = ((4, 1024, 4), (8, 512, 4), (8, 1024, 4), (16, 256, 4), (16, 512, 4), (32, 256, 4), (16, 512, 8))


def fused_sweep(report: Report) -> None:
    """The norm / SiLU prologue variants (fused_linear.py) on the Qwen3-0.6B layers that take them, per config,
    next to the two separate kernels (Triton rms_norm or silu_and_mul, then the GEMV)."""
    from atom_kernels.triton.activation import silu_and_mul
    from atom_kernels.triton.norm import rms_norm

    g = torch.Generator(device="cuda").manual_seed(2)
    for name in ("qkv", "gate_up", "down"):
        n, k = QWEN3_06B[name]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5
        if name == "down":
            x = torch.randn(2 * k, device="cuda", dtype=torch.bfloat16, generator=g)
            fns = {"separate": lambda x=x, w=w: gemv(silu_and_mul(x), w, None)}
            fns |= {c: functools.partial(gemv, x, w, None, (*c, 1), prologue=2) for c in FUSED_SWEEP}
        else:
            x, r, nw = (torch.randn(k, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            out = torch.empty_like(x)
            fns = {"separate": lambda x=x, w=w, nw=nw, r=r: gemv(rms_norm(x, nw, 1e-6, r)[0], w, None)}
            fns |= {c: functools.partial(gemv, x, w, None, (*c, 1), prologue=1, residual=r, norm_weight=nw,
                                         eps=1e-6, residual_out=out) for c in FUSED_SWEEP}
        times, failed = gpu_times(fns, ROUNDS, REPS)
        med = {c: statistics.median(t) * 1e3 for c, t in times.items()}
        report.say(f"{name} {n}x{k}: separate {med.pop('separate'):.1f} us; fused (block_n, block_k, warps): "
                   + "; ".join(f"{c} {t:.1f}" for c, t in sorted(med.items(), key=lambda ct: ct[1]))
                   + (f" ({len(failed)} failed)" * bool(failed)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--fused", action="store_true", help="time the norm / SiLU prologue variants instead")
    report = Report("linear_gemv", ap)
    args = ap.parse_args()
    copy_bw = copy_bandwidth()
    report.say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; device copy bandwidth "
               f"{copy_bw / 1e9:.0f} GB/s")
    if args.fused:
        fused_sweep(report)
    else:
        if args.sweep:
            sweep(report)
        table(report, copy_bw)
    report.save(args.out)


if __name__ == "__main__":
    main()
