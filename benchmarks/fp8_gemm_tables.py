"""benchmarks/fp8_gemm.py's closing tables: the summary (ours against the fastest peer, weight bandwidth at small M),
the crossover of ours' two large-M paths (what sets CUBLAS_MIN_M) and the per-channel format against torch's rowwise
GEMM. rows: (model, layer, N, K, M, {name: median ms}, weight bytes, flops) per shape and M."""

from __future__ import annotations

from common import ratio_line

from atom_kernels.triton.fp8_gemv import GEMV_MAX_M
from atom_kernels.triton.fp8_linear import CUBLAS_MIN_M

INFO = ("quantize: reference", "quantize: triton")  # timed, never ranked
# "ours" is ranked against the peers; the forced paths are not; the per-channel rows against "scaled_mm row" apart
OURS = ("ours", "ours: tile", "ours: cublas", "ours: channel", "ours: channel tile")


def summary_table(say, rows, copy_bw) -> None:
    say(f"\n{'model':14s} {'layer':15s} {'N x K':>13s} {'M':>5s} {'ours us':>9s} {'TFLOP/s':>8s} {'GB/s':>6s} "
        f"{'of copy':>7s} {'fastest peer':>16s} {'peer us':>9s} {'ours/fastest':>12s}")
    worst = worst_bw = None
    for model, layer, n, k, m, med, weight_bytes, flops in rows:
        ranked = {name: t for name, t in med.items() if name not in INFO and name not in OURS}
        ours = med.get("ours")
        if ours is None or not ranked:
            say(f"{model:14s} {layer:15s} {n:>6d} x {k:<6d} {m:>5d}  (ours or every peer missing)")
            continue
        peer = min(ranked, key=ranked.get)
        speed = ranked[peer] / ours
        if worst is None or speed < worst[0]:
            worst = (speed, f"{model} {layer} M={m}", ranked[peer], ours)
        t = ours * 1e-3
        if m <= GEMV_MAX_M and (worst_bw is None or weight_bytes / t < worst_bw[0]):
            worst_bw = (weight_bytes / t, f"{model} {layer} M={m}")
        say(f"{model:14s} {layer:15s} {n:>6d} x {k:<6d} {m:>5d} {ours * 1e3:9.1f} {flops / t / 1e12:8.1f} "
            f"{weight_bytes / t / 1e9:6.0f} {weight_bytes / t / copy_bw:7.2f} {peer:>16s} {ranked[peer] * 1e3:9.1f} "
            f"{speed:12.2f}")
    if worst:
        say(ratio_line(f"fp8 GEMM speed ours/fastest peer, worst shape ({worst[1]})", worst[2], worst[3],
                       " (> 1: ours faster; goal >= 0.9 everywhere)"))
    if worst_bw:
        say(ratio_line(f"fp8 GEMM weight GB/s over copy bandwidth at M <= {GEMV_MAX_M}, worst shape ({worst_bw[1]})",
                       worst_bw[0], copy_bw, " (goal >= 0.7)"))
    crossover_table(say, rows)
    per_channel_table(say, rows, copy_bw)


def per_channel_table(say, rows, copy_bw) -> None:
    """The per-channel format (per-token activations): ours (fp8_linear with block_k = K: the GEMV, the tile kernel
    or torch's rowwise GEMM after our quantizer) vs torch's rowwise scaled_mm with its quantization in torch ops."""
    done = [(model, layer, m, med, n * k + 4 * n) for model, layer, n, k, m, med, _, _ in rows
            if "ours: channel" in med and "scaled_mm row" in med]  # weight bytes: e4m3 and one scale a row
    if not done:
        return
    say(f"\nper channel: {'model':14s} {'layer':15s} {'M':>5s} {'ours us':>9s} {'of copy':>7s} {'tile us':>9s} "
        f"{'row us':>9s} {'row/ours':>8s}")
    worst = None
    for model, layer, m, med, weight_bytes in done:
        ours, row = med["ours: channel"], med["scaled_mm row"]
        tile = f"{med['ours: channel tile'] * 1e3:9.1f}" if "ours: channel tile" in med else f"{'':9s}"
        say(f"{'':13s}{model:14s} {layer:15s} {m:>5d} {ours * 1e3:9.1f} {weight_bytes / (ours * 1e-3) / copy_bw:7.2f} "
            f"{tile} {row * 1e3:9.1f} {row / ours:8.2f}")
        if worst is None or row / ours < worst[0]:
            worst = (row / ours, f"{model} {layer} M={m}", row, ours)
    say(ratio_line(f"per-channel fp8 GEMM speed ours/torch rowwise, worst shape ({worst[1]})", worst[2], worst[3],
                   " (> 1: ours faster)"))


def crossover_table(say, rows) -> None:
    """Ours' two large-M paths side by side (M > GEMV_MAX_M): where cuBLAS starts to win, by K, sets CUBLAS_MIN_M."""
    pairs = [(model, layer, m, med) for model, layer, _, _, m, med, _, _ in rows
             if "ours: tile" in med and "ours: cublas" in med]
    if not pairs:
        return
    say(f"\ncrossover (CUBLAS_MIN_M, (smallest K, smallest M): {CUBLAS_MIN_M}): {'model':14s} {'layer':15s} "
        f"{'M':>5s} {'tile us':>9s} "
        f"{'cublas us':>9s} {'tile/cublas':>11s}")
    for model, layer, m, med in pairs:
        tile, cublas = med["ours: tile"], med["ours: cublas"]
        say(f"{'':34s}{model:14s} {layer:15s} {m:>5d} {tile * 1e3:9.1f} {cublas * 1e3:9.1f} {tile / cublas:11.2f}")
