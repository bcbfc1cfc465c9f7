"""Block-scaled FP8 GEMM (the fp8 checkpoints' linear layers) vs its peers, same run: time, TFLOP/s, weight GB/s.

Shapes: the linear layers of DeepSeek-V3 (MLA projections, the dense MLP of its first layers, the shared expert) and
Qwen3-30B-A3B (attention; one expert's GEMMs), N x K unsharded, at M = 1, 32, 256, 4096 rows; bf16 in and out,
e4m3 weights with 128x128 block scales (random, std 1/sqrt(K), quantized as the releases do), activations quantized
per token and 128 columns. Every row is a whole linear as a layer runs it (activation quantization + GEMM):
  ours             atom_kernels.fp8_linear on CUDA (the dispatcher's triton/fp8_linear.py) with block_n = 128
                   (these weights' rows are whole 128-row blocks, as an unfused layer's): the path it picks
  ours: tile       at M > 32, its two large-M paths forced: the Triton tile GEMM (fp8_linear.gemm) and cuBLAS'
  ours: cublas     blockwise GEMM after our quantizer (fp8_cublas.cublas_linear; where the probe found it), so the
                   crossover M by K (CUBLAS_MIN_M in atom_kernels/triton/fp8_linear.py) can be read off; the
                   "crossover" table at the end lists both per shape and M
  scaled_mm block  torch's blockwise scaled GEMM (1x128 x 128x128 scales) where this torch build has it (probed on
                   a small problem first; the header says which spelling or why none), activations quantized by
                   atom_kernels.reference.fp8.fp8_quantize
  scaled_mm row    torch._scaled_mm rowwise: per-token activation and per-channel weight scales (the per-channel
                   format, same weight bytes)
  ours: channel    atom_kernels.fp8_linear on those per-channel operands (block_k = act_group = K): the GEMV, the
                   tile kernel or torch's rowwise GEMM after our quantizer; "ours: channel tile" the tile kernel
                   forced at M > 32; compared with "scaled_mm row" in the "per channel" table
  vllm triton      vLLM's per_token_group_quant_fp8 + w8a8_triton_block_scaled_mm   (when vllm imports)
  vllm cutlass     vLLM's per_token_group_quant_fp8 + cutlass_scaled_mm with block scales (its Hopper default)
  quantize only    the activation quantization alone: the reference ours uses now, and fp8_quantize_rows (Triton)
Every output is first compared with float32 on its own dequantized operands (err = max |y - y32| / max |y32|);
one beyond 3e-2 is marked WRONG and not ranked. GB/s: weight bytes (e4m3 + float32 scales) / time; "of copy": that
over the device copy bandwidth measured in the same run. Timing: common's gpu_times (CUDA events, interleaved
rounds, L2 flushed before every launch, median). The summary table ends with ours' speed over the fastest peer's
(time peer / time ours: > 1 means ours is faster); the ratio lines give the worst shape, and at M <= 32 (ours'
GEMV, fp8_gemv.py: each shape's line names the variant and split) the lowest weight bandwidth as a fraction of copy
bandwidth (goal >= 0.7). Needs a CUDA GPU.

    python benchmarks/fp8_gemm.py [--models dsv3 qwen3-30b-a3b] [--m 1 32 64 256 4096] [--out FILE]
    python benchmarks/fp8_gemm.py --m 40 48 64 96 128 256   # the tile / cuBLAS crossover, for CUBLAS_MIN_M
    python benchmarks/fp8_gemm.py --sweep [--layers "dsv3 mlp gate_up" ...] [--m 256 4096]
--sweep times ours' tile GEMM (M > 32) under every candidate of SWEEP instead, fastest first, beside GEMM_TILES'
choice: what to write into GEMM_TILES (atom_kernels/triton/fp8_linear.py); at M <= 32 ours' GEMV under GEMV_SWEEP
(programs per SM through the split-K count, pipeline stages, warps) beside gemv_config's choice, with the weight
bandwidth as a fraction of copy: what to write into gemv_config (atom_kernels/triton/fp8_gemv.py).
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch
from common import Report, copy_bandwidth, gpu_times, summary
from fp8_gemm_tables import INFO, summary_table
from fp8_peers import (
    BLOCK,
    block_quantize,
    dequantize,
    rows_layout,
    rowwise_quantize,
    torch_blockwise_mm,
    vllm_block_gemms,
)

import atom_kernels
from atom_kernels import dispatch
from atom_kernels.reference.fp8 import fp8_dequantize, fp8_quantize
from atom_kernels.triton import fp8_cublas
from atom_kernels.triton.attention.decode import num_sms
from atom_kernels.triton.fp8_gemv import GEMV_MAX_M, MIN_BLOCKS_PER_SPLIT, fp8_gemv, gemv_config
from atom_kernels.triton.fp8_linear import cublas_min_m, gemm, gemm_tiles, path, tma_loads
from atom_kernels.triton.fp8_quant import fp8_quantize_rows

SHAPES = {  # layer → (N, K)
    "dsv3": {"fused_qkv_a": (2112, 7168), "q_b": (24576, 1536), "o": (7168, 16384), "mlp gate_up": (36864, 7168),
             "mlp down": (7168, 18432), "shared gate_up": (4096, 7168), "shared down": (7168, 2048)},
    "qwen3-30b-a3b": {"qkv": (5120, 2048), "o": (2048, 4096), "expert gate_up": (1536, 2048),
                      "expert down": (2048, 768)},
    "qwen3-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)},
}
ROWS = (1, 32, 64, 256, 4096)
# --sweep's tile candidates (BLOCK_M, BLOCK_N, warps, stages, GROUP_M), each with TMA and with pointer loads, and
# default layers: the largest DeepSeek-V3 GEMMs and a Qwen3-30B-A3B attention projection
SWEEP = [(bm, bn, w, st, 8) for bm in (64, 128) for bn in (64, 128, 256) for w in (4, 8) for st in (3, 4)
         if not (bm == 128 and bn == 256 and st == 4)]  # 192 KB of stages: over the SM's budget
SWEEP_LAYERS = ("dsv3 mlp gate_up", "dsv3 o", "qwen3-30b-a3b qkv")
# --sweep's GEMV candidates (M <= 32): (programs per SM aimed at through the split-K count, stages, warps)
GEMV_SWEEP = [(p, st, w) for p in (1, 2, 4, 8) for st in (3, 4, 6, 8) for w in (4, 8)]
ROUNDS, REPS = 3, 10
TOL = 3e-2
ROW_WANTS = ("scaled_mm row", "ours: channel", "ours: channel tile")  # the per-channel format's operands


def rowwise_mm(x, wq, ws):
    """torch._scaled_mm rowwise with the per-token activation quantization in torch ops."""
    xq, xs = rowwise_quantize(x)
    return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)


def implementations(x, w, peers) -> tuple[dict, dict]:
    """({name: fn}, {name: float32 result on the operands it dequantizes}) for one shape and M."""
    wq, ws = block_quantize(w)
    wq_r, ws_r = rowwise_quantize(w)
    ws_rows = rows_layout(ws, w.shape[0])
    xq, xs = fp8_quantize(x, BLOCK)
    block_want = fp8_dequantize(xq, xs, BLOCK) @ dequantize(wq, ws).t()
    xq_r, xs_r = rowwise_quantize(x)
    row_want = (xq_r.float() * xs_r) @ (wq_r.float() * ws_r).t()
    fns = {"ours": functools.partial(atom_kernels.fp8_linear, x, wq, ws_rows, BLOCK, BLOCK, None, None, BLOCK)}
    if x.shape[0] > GEMV_MAX_M:
        fns["ours: tile"] = functools.partial(gemm, x, wq, ws_rows, BLOCK, None)
        if fp8_cublas.fits(x, wq, None):
            fns["ours: cublas"] = functools.partial(fp8_cublas.cublas_linear, x, wq, ws_rows, None)
    if peers["scaled_mm block"] is not None:
        blockwise = peers["scaled_mm block"]
        fns["scaled_mm block"] = lambda: blockwise(*fp8_quantize(x, BLOCK), wq, ws)
    fns["scaled_mm row"] = functools.partial(rowwise_mm, x, wq_r, ws_r)
    k = x.shape[1]
    fns["ours: channel"] = functools.partial(atom_kernels.fp8_linear, x, wq_r, ws_r, k, k)
    if x.shape[0] > GEMV_MAX_M:
        fns["ours: channel tile"] = functools.partial(gemm, x, wq_r, ws_r, k, None)
    for name, fn in peers["vllm"].items():
        fns[name] = functools.partial(fn, x, wq, ws)
    fns["quantize: reference"] = functools.partial(fp8_quantize, x, BLOCK)
    fns["quantize: triton"] = functools.partial(fp8_quantize_rows, x, BLOCK)
    wants = {name: row_want if name in ROW_WANTS else block_want for name in fns if name not in INFO}
    return fns, wants


def errors(fns: dict, wants: dict) -> dict:
    out = {}
    for name, want in wants.items():
        try:
            out[name] = ((fns[name]().float() - want).abs().max() / want.abs().max()).item()
        except Exception as e:  # noqa: BLE001 - reported in the table
            out[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    return out


def run_case(say, model, layer, n, k, m, peers, copy_bw):
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    w = torch.randn(n, k, device="cuda", generator=g) * k**-0.5
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    fns, wants = implementations(x, w, peers)
    del w
    err = errors(fns, wants)
    del wants
    live = {name: fn for name, fn in fns.items() if name in INFO or isinstance(err[name], float)}
    times, failed = gpu_times(live, ROUNDS, REPS)
    weight_bytes, flops = n * k + 4 * n * -(-k // 128), 2 * m * n * k
    say(f"\n{model} {layer} {n} x {k}, M = {m}: ours {ours_path(x, fns)}")
    med = {}
    for name in fns:
        if name not in times:
            say(f"  {name:16s} failed: {failed.get(name) or err.get(name)}")
            continue
        med[name], lo, hi = summary(times[name], ROUNDS)
        t = med[name] * 1e-3
        bad = name not in INFO and err[name] > TOL
        e = "" if name in INFO else f"err {err[name]:.1e}" + ("  WRONG" if bad else "")
        say(f"  {name:16s} {med[name] * 1e3:9.1f} us  {flops / t / 1e12:7.1f} TFLOP/s  {weight_bytes / t / 1e9:6.0f} "
            f"GB/s  {weight_bytes / t / copy_bw:5.2f} of copy  {e:22s} rounds {lo * 1e3:.1f}..{hi * 1e3:.1f}")
        if bad:
            med.pop(name)
    return med, weight_bytes, flops


def ours_path(x: torch.Tensor, fns: dict) -> str:
    """Which of atom_kernels.fp8_linear's kernels (fp8_linear.path) runs x [M, K] on this shape's weight (the one
    "ours" multiplies) on this GPU, with its launch parameters, or why not cuBLAS."""
    wq = fns["ours"].args[1]
    (m, k), n, sms = x.shape, wq.shape[0], num_sms(torch.device("cuda"))
    kernel = path(x, wq, BLOCK, None, BLOCK)
    if kernel == "gemv":
        c = gemv_config(m, n, -(-k // BLOCK), sms)
        return f"GEMV, BLOCK_N {c['BLOCK_N']}, BLOCK_M {c['BLOCK_M']}, split-K {c['splits']} x {c['per']} blocks"
    tile = f"tile GEMM (BLOCK_M, BLOCK_N, warps, stages, GROUP_M) = {gemm_tiles(m, n, sms)}, TMA loads {tma_loads(wq)}"
    if kernel == "cublas":
        return f"cuBLAS blockwise GEMM (M >= cublas_min_m(K) = {cublas_min_m(k)}); ours: tile is the {tile}"
    if "ours: cublas" in fns:
        return f"{tile} (M < cublas_min_m(K) = {cublas_min_m(k)})"
    return f"{tile} (cuBLAS: {fp8_cublas.support(x.device, x.dtype).note or 'outside fp8_cublas.fits'})"


def sweep(say, n: int, k: int, m: int) -> None:
    """Ours' tile GEMM on one shape under every SWEEP candidate, TMA loads and pointer loads (and GEMM_TILES'
    choice), fastest first."""
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    wq, ws = block_quantize(torch.randn(n, k, device="cuda", generator=g) * k**-0.5)
    ws_rows = rows_layout(ws, n)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    chosen = (gemm_tiles(m, n, num_sms(torch.device("cuda"))), tma_loads(wq))
    fns = {(tiles, tma): functools.partial(gemm, x, wq, ws_rows, BLOCK, None, tiles, tma)
           for tiles in {*SWEEP, chosen[0]} for tma in (False, True)}
    times, failed = gpu_times(fns, ROUNDS, REPS)
    ranked = sorted((summary(t, ROUNDS)[0], key) for key, t in times.items())
    flops = 2 * m * n * k
    for med, (tiles, tma) in ranked[:8]:
        say(f"  {tiles} {'TMA' if tma else 'ptr'}  {med * 1e3:9.1f} us  {flops / med / 1e9:7.1f} TFLOP/s"
            + ("  (GEMM_TILES)" if (tiles, tma) == chosen else ""))
    if chosen in times and chosen not in [key for _, key in ranked[:8]]:
        say(f"  GEMM_TILES' {chosen}: {summary(times[chosen], ROUNDS)[0] * 1e3:.1f} us")
    if failed:
        say(f"  {len(failed)} candidates failed, e.g. {next(iter(failed.values()))}")


def sweep_gemv(say, n: int, k: int, m: int, copy_bw: float) -> None:
    """Ours' GEMV on one shape under every GEMV_SWEEP candidate (and gemv_config's choice), fastest first."""
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    wq, ws = block_quantize(torch.randn(n, k, device="cuda", generator=g) * k**-0.5)
    ws_rows = rows_layout(ws, n)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    sms, kb, tiles = num_sms(x.device), ws_rows.shape[1], -(-n // 64)
    chosen = gemv_config(m, n, kb, sms)
    configs = {"gemv_config": {}}
    for per_sm, stages, warps in GEMV_SWEEP:
        split = max(1, min(-(-per_sm * sms // tiles), kb // MIN_BLOCKS_PER_SPLIT))
        per = -(-kb // split)
        configs[f"{per_sm}/SM splits {-(-kb // per):3d} stages {stages} warps {warps}"] = dict(
            splits=-(-kb // per), per=per, num_stages=stages, num_warps=warps)
    fns = {name: functools.partial(fp8_gemv, x, wq, ws_rows, BLOCK, None, **cfg) for name, cfg in configs.items()}
    times, failed = gpu_times(fns, ROUNDS, REPS)
    weight_bytes = wq.numel() + ws_rows.numel() * 4
    say(f"  gemv_config: splits {chosen['splits']}, stages {chosen['num_stages']}, warps {chosen['num_warps']}")
    for med, name in sorted((summary(t, ROUNDS)[0], name) for name, t in times.items())[:8]:
        say(f"  {name:40s} {med * 1e3:8.1f} us  {weight_bytes / med / 1e9 / (copy_bw / 1e9) * 1e3:5.2f} of copy")
    if "gemv_config" in times:
        say(f"  gemv_config's: {summary(times['gemv_config'], ROUNDS)[0] * 1e3:.1f} us")
    if failed:
        say(f"  {len(failed)} candidates failed, e.g. {next(iter(failed.values()))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--m", type=int, nargs="+", default=ROWS, help="rows (tokens) per GEMM")
    parser.add_argument("--sweep", action="store_true", help="time the tile GEMM's SWEEP candidates instead")
    parser.add_argument("--layers", nargs="+", default=SWEEP_LAYERS, help="--sweep's layers ('model layer')")
    report = Report("fp8_gemm", parser)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/fp8_gemm.py times CUDA kernels and found no GPU (torch.cuda.is_available() is False); "
              "run it on a CUDA machine (see docs/fp8.md)", file=sys.stderr)
        return 2
    say = report.say
    say(report.header())
    if args.sweep:
        copy_bw = copy_bandwidth()
        for name in args.layers:
            model, layer = name.split(" ", 1)
            n, k = SHAPES[model][layer]
            for m in args.m:
                say(f"\nsweep {name} {n} x {k}, M = {m} (fastest first):")
                (sweep(say, n, k, m) if m > GEMV_MAX_M else sweep_gemv(say, n, k, m, copy_bw))
        report.save(args.out)
        return 0
    blockwise, note = torch_blockwise_mm()
    say(f"scaled_mm block: {note if blockwise else 'not supported by this torch build: ' + note}")
    vllm_fns, vllm_note = vllm_block_gemms()
    say(f"vllm: {vllm_note}; ours: atom_kernels.fp8_linear runs the "
        f"{dispatch.backend('fp8_linear', torch.device('cuda'))} backend")
    peers = {"scaled_mm block": blockwise, "vllm": vllm_fns}
    copy_bw = copy_bandwidth()
    say(f"device copy bandwidth: {copy_bw / 1e9:.0f} GB/s; median of {ROUNDS} rounds x {REPS} launches")
    rows = []
    for model in args.models:
        for layer, (n, k) in SHAPES[model].items():
            for m in args.m:
                med, weight_bytes, flops = run_case(say, model, layer, n, k, m, peers, copy_bw)
                rows.append((model, layer, n, k, m, med, weight_bytes, flops))
                torch.cuda.empty_cache()
    summary_table(say, rows, copy_bw)
    report.save(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
