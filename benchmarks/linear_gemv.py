"""Linear layers at decode batch sizes: our Triton GEMV vs cuBLAS (F.linear) on the same weights.

Shapes: the layers of Qwen3-0.6B (the native benchmarks' checkpoint) and of an 8B Llama, at M = 1, 2, 4, 8 rows,
bf16. Each launch reads the weight from HBM (L2 flushed before every rep by gpu_times, as in a model whose
layers' weights do not fit in L2). Bandwidth = weight + x + y bytes / time; "of copy" = that over the device
copy bandwidth of this run. Ratio = cuBLAS time / ours (> 1: ours faster), per row and summed over one
Qwen3-0.6B layer (qkv, o, gate_up, down), last.

    python benchmarks/linear_gemv.py [--sweep] [--out FILE]

--sweep also times a grid of launch configs (block_n, block_k, warps, stages) per Qwen3-0.6B shape at M = 1 and 8,
to tune gemv_config.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics

import torch
import torch.nn.functional as F
from attention_decode import Report, gpu_times, summary
from mla_decode import copy_bandwidth

from atom_kernels.triton.linear import gemv, gemv_config

QWEN3_06B = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
             "lm_head": (151936, 1024)}
LLAMA_8B = {"8b qkv": (6144, 4096), "8b o": (4096, 4096), "8b gate_up": (28672, 4096), "8b down": (4096, 14336)}
ROWS = (1, 2, 4, 8)
ROUNDS, REPS = 3, 20
# --sweep grids (block_n, block_k, warps, stages): one row (FMAs) and 8 rows (tensor-core dots)
SWEEP = {1: dict(block_n=(2, 4, 8), block_k=(512, 1024, 2048), warps=(4, 8), stages=(1,)),
         8: dict(block_n=(16, 32, 64), block_k=(64, 128, 256, 512), warps=(4,), stages=(2, 3, 4))}


def inputs(m: int, n: int, k: int, g: torch.Generator):
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    return x, w


def check(x, w) -> float:
    """Max |ours - fp32 reference| over max |reference| (bf16 rounding ~4e-3)."""
    want = F.linear(x.float(), w.float())
    return ((gemv(x, w, None).float() - want).abs().max() / want.abs().max()).item()


def table(report: Report, copy_bw: float) -> None:
    say = report.say
    say(f"{'layer':>10} {'N x K':>13} {'M':>2}  {'ours us':>8} {'GB/s':>6} {'of copy':>7}  {'cuBLAS us':>9} "
        f"{'GB/s':>6}  {'err':>7}  {'cuBLAS/ours':>11}")
    g = torch.Generator(device="cuda").manual_seed(0)
    layer = {m: [0.0, 0.0] for m in ROWS}  # Qwen3-0.6B layer sums: ours, cuBLAS
    for name, (n, k) in {**QWEN3_06B, **LLAMA_8B}.items():
        for m in ROWS:
            x, w = inputs(m, n, k, g)
            fns = {"ours": functools.partial(gemv, x, w, None), "cublas": functools.partial(F.linear, x, w)}
            times, _ = gpu_times(fns, ROUNDS, REPS)
            ours, cublas = summary(times["ours"], ROUNDS)[0], summary(times["cublas"], ROUNDS)[0]
            nbytes = 2 * (n * k + m * k + m * n)
            if name in QWEN3_06B and name != "lm_head":
                layer[m][0] += ours
                layer[m][1] += cublas
            say(f"{name:>10} {n:>6} x {k:>5} {m:>2}  {ours * 1e3:>8.1f} {nbytes / ours / 1e6:>6.0f} "
                f"{nbytes / ours / 1e6 / (copy_bw / 1e9):>7.2f}  {cublas * 1e3:>9.1f} {nbytes / cublas / 1e6:>6.0f}  "
                f"{check(x, w):>7.1e}  {cublas / ours:>11.2f}")
    say()
    say("Qwen3-0.6B layer (qkv + o + gate_up + down), us: " + ", ".join(
        f"M={m}: ours {o * 1e3:.1f} cuBLAS {c * 1e3:.1f}" for m, (o, c) in layer.items()))
    say("cuBLAS/ours per Qwen3-0.6B layer: " + ", ".join(f"M={m} {c / o:.2f}" for m, (o, c) in layer.items()))


def sweep(report: Report) -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    for name, (n, k) in QWEN3_06B.items():
        for m, grid in SWEEP.items():
            x, w = inputs(m, n, k, g)
            cfgs = [c for c in itertools.product(*grid.values()) if n // c[0] >= 32 and c[1] <= k]
            fns = {c: functools.partial(gemv, x, w, None, c) for c in cfgs}
            times, failed = gpu_times(fns, 2, 10)
            best = sorted((statistics.median(t), c) for c, t in times.items())[:5]
            default = gemv_config(m, n, k)
            report.say(f"{name} M={m}: default {default} "
                       f"{statistics.median(times[default]) * 1e3 if default in times else float('nan'):.1f} us; best "
                       + "; ".join(f"{c} {t * 1e3:.1f} us" for t, c in best) + (f" ({len(failed)} failed)" if failed
                                                                                else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true")
    report = Report("linear_gemv", ap)
    args = ap.parse_args()
    copy_bw = copy_bandwidth()
    report.say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; device copy bandwidth "
               f"{copy_bw / 1e9:.0f} GB/s")
    if args.sweep:
        sweep(report)
    table(report, copy_bw)
    report.save(args.out)


if __name__ == "__main__":
    main()
