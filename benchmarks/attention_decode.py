"""Paged decode attention vs torch SDPA: achieved KV bandwidth, and fp8-KV vs bf16-KV decode time.

For B x L in {32x4096, 128x2048, 8x16384}, 16 query / 8 KV heads, head_dim 128, bf16: our Triton decode
reads a paged cache (block size 16, blocks shuffled); torch SDPA reads the same K/V stored contiguously
([B, kv_heads, L, d], GQA through enable_gqa, each SDPA backend that accepts it, and also with K/V
expanded to 16 heads). Bandwidth = bytes of K+V actually read / time. The ratio is ours / the SDPA
variant with the highest bandwidth (goal >= 0.9); fp8/bf16 is our decode time with an fp8 e4m3 cache
over that with a bf16 cache (goal <= 0.6).

Then batches of mixed context lengths (B in {256, 128, 64, 32}, contexts uniform in [lo, 2048]: the decode
batches of benchmarks/native_gpu.py --throughput as it drains) as a model step runs them (the step memo, so
launched longest first) and in batch order (no memo; the grid as now, sequences its slowest axis), as fractions
of the copy bandwidth.

Timing: common.gpu_times (ROUNDS interleaved rounds, reps queued behind a GPU sleep, L2 flushed before each
launch); reported: the median over all reps, and the spread of the per-round medians (min..max).

    python benchmarks/attention_decode.py [--sweep] [--out FILE]

--sweep also times a grid of decode launch configs per shape (to tune decode_config); its kernels are
compiled first in parallel worker processes (Triton's on-disk cache), so the GPU does not wait on them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import multiprocessing
import os
import random
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from common import Report, copy_bandwidth, gpu_times, shuffled_tables, summary
from torch.nn.attention import SDPBackend, sdpa_kernel

import atom_kernels
from atom_kernels.triton.attention.common import softmax_scale
from atom_kernels.triton.attention.decode import decode_config, launch_decode

SHAPES = [(32, 4096), (128, 2048), (8, 16384)]
MIXED = [(256, 100), (128, 300), (64, 500), (32, 800)]  # (batch, shortest context): contexts uniform in [lo, 2048]
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 16
ROUNDS, REPS = 5, 30  # main rows: 150 timed launches each
SWEEP_ROUNDS, SWEEP_REPS = 2, 10
FP8 = torch.float8_e4m3fn

# --sweep grid per cache dtype: (block_n, num_warps, num_stages, v_regs, f16_dots[, maxnreg]). The former fp8
# path (bf16 dots, V bytes gathered from shared memory) stays in as the baseline.
SWEEP_SPLITS = (1, 2, 3, 4, 6, 8, 12)
SWEEP = {
    "bf16": [(64, 4, 2, False, True), (64, 4, 3, False, True), (64, 4, 4, False, True), (128, 4, 2, False, True),
             (64, 8, 3, False, True), (128, 8, 3, False, True)],
    "fp8": [(64, 4, 5, False, False), (64, 4, 3, False, False), (128, 4, 3, False, False),
            (64, 4, 2, False, True), (64, 4, 3, False, True), (64, 4, 4, False, True), (64, 8, 3, False, True),
            (128, 4, 3, False, True), (128, 8, 3, False, True),
            (64, 4, 2, True, True), (64, 4, 3, True, True), (64, 4, 4, True, True), (64, 8, 2, True, True),
            (64, 8, 3, True, True), (64, 8, 4, True, True), (128, 8, 2, True, True), (128, 8, 3, True, True),
            (64, 8, 3, True, True, 80), (64, 8, 4, True, True, 80),  # 80 registers: 3 programs of 8 warps per SM
            # deeper pipelines / bigger tiles for fp8 (more bytes in flight per program)
            (128, 4, 2, False, True), (128, 4, 4, False, True), (128, 8, 4, False, True),
            (256, 8, 2, False, True), (256, 8, 3, False, True), (256, 4, 2, False, True)],
}


def paged_inputs(b: int, seq: int, g: torch.Generator):
    """Contiguous K/V [b, kv_heads, seq, d] (bf16) and the same values in a shuffled paged cache."""
    dev = "cuda"
    k = torch.randn(b, KV_HEADS, seq, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, KV_HEADS, seq, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=g)
    per_seq = seq // BLOCK
    perm = torch.randperm(b * per_seq, device=dev, generator=g)
    tables = perm.view(b, per_seq).to(torch.int32)
    # cache[block] = tokens [j*BLOCK, (j+1)*BLOCK) of sequence i, for tables[i, j] == block
    caches = []
    for x in (k, v):
        # [b, kvh, blocks, BLOCK, d] → [b, blocks, BLOCK, kvh, d]
        blocks = x.view(b, KV_HEADS, per_seq, BLOCK, HEAD_DIM).permute(0, 2, 3, 1, 4)
        cache = torch.empty(b * per_seq, BLOCK, KV_HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
        cache[perm] = blocks.reshape(-1, BLOCK, KV_HEADS, HEAD_DIM)
        caches.append(cache)
    return k, v, caches[0], caches[1], tables


def ours(q, kc, vc, tables, seq_lens, qsl, seq, scales=(None, None), memo=True):
    """Our decode through the public op (dispatcher, checks, decode_config: what a model step runs), with a step
    memo as a model step has (decode_order made once, as a step's first layer does); memo=False: batch order."""
    hints = dict(max_query_len=1, max_seq_len=seq, num_decodes=q.shape[0], num_prefills=0)
    out = torch.empty_like(q)
    plan_cache = {} if memo else None
    return lambda: atom_kernels.paged_attention(q, kc, vc, tables, seq_lens, qsl, HEAD_DIM**-0.5,
                                                k_scale=scales[0], v_scale=scales[1], out=out, plan_cache=plan_cache,
                                                **hints)


def mixed_inputs(lens: list[int], g: torch.Generator, dtype=torch.bfloat16):
    """A paged cache (block size BLOCK, blocks shuffled) for sequences of the given lengths, no contiguous copy."""
    tables, num_blocks = shuffled_tables(lens, g)
    kc, vc = (torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, device="cuda", generator=g).to(dtype)
              for _ in range(2))
    return kc, vc, tables


def mixed_rows(g: torch.Generator, say, bw: float) -> list[tuple]:
    """Batches of mixed context lengths (the offline serving workload's decode batches as it drains: contexts
    uniform in [lo, 2048]): ours launched longest first vs in batch order (no memo), the same run."""
    rng = random.Random(0)
    rows = []
    say(f"\nmixed context lengths (uniform in [lo, 2048]), bf16 KV; copy bandwidth {bw / 1e9:.0f} GB/s")
    for b, lo in MIXED:
        lens = [rng.randint(lo, 2048) for _ in range(b)]
        q = torch.randn(b, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
        kc, vc, tables = mixed_inputs(lens, g)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        qsl = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        fns = {"longest first": ours(q, kc, vc, tables, seq_lens, qsl, max(lens)),
               "batch order": ours(q, kc, vc, tables, seq_lens, qsl, max(lens), memo=False)}
        outs = [fn().clone() for fn in fns.values()]
        assert torch.equal(outs[0], outs[1]), "the launch order changed the result"
        timed, failed = gpu_times(fns, ROUNDS, REPS)
        assert not failed, failed
        kv_bytes = sum(lens) * KV_HEADS * HEAD_DIM * 2 * 2
        t = {n: summary(ts, ROUNDS)[0] for n, ts in timed.items()}
        rows.append((b, lo, *(kv_bytes / (t[n] * 1e-3) / bw for n in fns), t["batch order"] / t["longest first"]))
        say(f"  {b:4d} x U[{lo}, 2048]: " + ", ".join(f"{n} {t[n] * 1e3:.1f} us" for n in fns))
        del kc, vc
        torch.cuda.empty_cache()
    return rows


def sdpa_variants(q, k, v):
    """name → (fn, bytes read multiplier) for every SDPA way that runs on this machine."""
    q4 = q.unsqueeze(2)  # [b, heads, 1, d]
    found = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        def fn(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)
        try:
            fn()
            torch.cuda.synchronize()
            found[f"sdpa-gqa-{backend.name.lower()}"] = (fn, 1)
        except RuntimeError:
            pass
    ke = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    ve = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    found["sdpa-expanded-default"] = (lambda: F.scaled_dot_product_attention(q4, ke, ve), HEADS // KV_HEADS)
    return found


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def max_err(q, k, v, got) -> float:
    """Max abs difference of our output vs fp32 SDPA on the same K/V values."""
    ref = F.scaled_dot_product_attention(q.unsqueeze(2).float(), k.float(), v.float(), enable_gqa=True)
    return (got.float() - ref.squeeze(2)).abs().max().item()


def sweep_fn(q, kc, vc, tables, seq_lens, qsl, scales, cfg, splits):
    block_n, warps, stages, v_regs, f16, *maxnreg = cfg
    out = torch.empty_like(q)
    return functools.partial(launch_decode, q, kc, vc, tables, seq_lens, qsl, softmax_scale(HEAD_DIM**-0.5), 0,
                             *scales, out, splits, block_n, warps, stages, v_regs=v_regs, f16_dots=f16,
                             maxnreg=maxnreg[0] if maxnreg else None)


def cfg_name(cfg, splits) -> str:
    block_n, warps, stages, v_regs, f16, *maxnreg = cfg
    return (f"splits={splits:2d} block_n={block_n:3d} warps={warps} stages={stages} v_regs={int(v_regs)} "
            f"f16_dots={int(f16)}" + (f" maxnreg={maxnreg[0]}" if maxnreg else ""))


def _compile_configs(job: list[tuple[str, tuple, int]]) -> int:
    """Worker: launch each (dtype, config, splits) once on a tiny problem with the same specialisation
    (strides, alignment) as the benchmark's, which leaves the compiled kernels in Triton's disk cache."""
    done = 0
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        b, seq = 2, 512
        q = torch.randn(b, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
        _, _, kc, vc, tables = paged_inputs(b, seq, g)
        seq_lens = torch.full((b,), seq, dtype=torch.int32, device="cuda")
        qsl = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        ones = torch.ones((), device="cuda")
        inputs = {"bf16": (kc, vc, (None, None)), "fp8": (kc.to(FP8), vc.to(FP8), (ones, ones))}
        for label, cfg, splits in job:
            k8, v8, scales = inputs[label]
            try:
                sweep_fn(q, k8, v8, tables, seq_lens, qsl, scales, cfg, splits)()
                done += 1
            except Exception:  # noqa: BLE001 - e.g. out of shared memory: the timed run reports it
                pass
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - e.g. no second CUDA context allowed: the main process compiles
        pass
    return done


def precompile(workers: int) -> str:
    """Compile the sweep's kernels in parallel processes; split counts other than 1 share one decode kernel
    (the merge kernel varies with the power of two above the count), so each config stays in one worker."""
    groups = [[(label, cfg, s) for s in (1, 2, 3, 6, 12)] for label, cfgs in SWEEP.items() for cfg in cfgs]
    chunks = [sum(groups[i::workers], []) for i in range(workers)]
    t = time.perf_counter()
    try:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            done = sum(pool.map(_compile_configs, chunks))
    except Exception as e:  # noqa: BLE001 - the sweep then compiles in-process
        return f"precompile failed ({type(e).__name__}: {e}); compiling in the sweep"
    n = sum(len(c) for c in chunks)
    return f"precompiled {done}/{n} sweep launches in {workers} processes, {time.perf_counter() - t:.0f} s"


def sweep(q, kc, vc, tables, seq_lens, qsl, scales, nbytes, label, default) -> list[str]:
    """Lines: every config of SWEEP[label] x SWEEP_SPLITS, fastest first."""
    fns = {(cfg, s): sweep_fn(q, kc, vc, tables, seq_lens, qsl, scales, cfg, s)
           for cfg in SWEEP[label] for s in SWEEP_SPLITS}
    times, failed = gpu_times(fns, SWEEP_ROUNDS, SWEEP_REPS)
    rows = [(float("inf"), f"{cfg_name(cfg, s)}: {err}") for (cfg, s), err in failed.items()]
    for (cfg, s), ts in times.items():
        name = cfg_name(cfg, s)
        med, lo, hi = summary(ts, SWEEP_ROUNDS)
        mark = "  <- decode_config" if (cfg, s) == default else ""
        rows.append((med, f"{name}: {med * 1e3:7.1f} us {gbps(nbytes, med):6.0f} GB/s "
                          f"(rounds {lo * 1e3:.1f}..{hi * 1e3:.1f}){mark}"))
    return [line for _, line in sorted(rows)]


def as_key(cfg: dict) -> tuple:
    """decode_config's dict as a sweep key (config tuple, splits)."""
    key = (cfg["block_n"], cfg["num_warps"], cfg["num_stages"], cfg["v_regs"], True)
    return key + ((cfg["maxnreg"],) if cfg.get("maxnreg") else ()), cfg["num_splits"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true")
    report = Report("attention_decode", parser)
    say = report.say
    args = parser.parse_args()
    say(report.header())
    say(f"heads {HEADS}/{KV_HEADS}, head_dim {HEAD_DIM}, bf16 queries, paged block size {BLOCK}; "
        f"median of {ROUNDS} interleaved rounds x {REPS} launches, L2 flushed before each")
    if args.sweep:
        say(precompile(min(16, os.cpu_count() or 1)))
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for b, seq in SHAPES:
        q = torch.randn(b, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v, kc, vc, tables = paged_inputs(b, seq, g)
        seq_lens = torch.full((b,), seq, dtype=torch.int32, device="cuda")
        qsl = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        kv_bytes = 2 * k.numel() * k.element_size()
        ones = torch.ones((), device="cuda")
        kc8, vc8 = kc.to(FP8), vc.to(FP8)
        fn = ours(q, kc, vc, tables, seq_lens, qsl, seq)
        fn8 = ours(q, kc8, vc8, tables, seq_lens, qsl, seq, (ones, ones))
        err = max_err(q, k, v, fn())
        err8 = max_err(q, k.to(FP8), v.to(FP8), fn8())  # vs SDPA on the same (fp8-rounded) values
        with warnings.catch_warnings():  # SDPA explains at length why a backend declines GQA
            warnings.simplefilter("ignore")
            peers = sdpa_variants(q, k, v)
            fns = {"ours (paged, bf16 KV)": fn, "ours (paged, fp8 KV)": fn8} | {n: f for n, (f, _) in peers.items()}
            timed, failed = gpu_times(fns, ROUNDS, REPS)
        assert not failed, failed
        times = {n: summary(ts, ROUNDS) for n, ts in timed.items()}
        mult = {n: m for n, (_, m) in peers.items()} | {"ours (paged, bf16 KV)": 1, "ours (paged, fp8 KV)": 0.5}
        cfg = decode_config(b, KV_HEADS, seq, HEAD_DIM, q.device)
        cfg8 = decode_config(b, KV_HEADS, seq, HEAD_DIM, q.device, FP8)
        say(f"\nB={b} L={seq}: KV {kv_bytes / 1e6:.0f} MB (bf16), max|ours - sdpa| bf16 KV {err:.2e}, "
            f"fp8 KV {err8:.2e} (SDPA on the fp8 values)")
        say(f"  decode_config bf16 {cfg}, fp8 {cfg8}")
        say(f"  {'':28s} {'median':>8s}  {'GB/s':>6s}   per-round medians")
        for name, (t, lo, hi) in times.items():
            say(f"  {name:28s} {t * 1e3:8.1f} us {gbps(mult[name] * kv_bytes, t):6.0f}   "
                f"{lo * 1e3:.1f}..{hi * 1e3:.1f} us ({(hi - lo) / t:.1%})")
        if args.sweep:
            for label, caches, scales, nbytes, c in (("bf16", (kc, vc), (None, None), kv_bytes, cfg),
                                                     ("fp8", (kc8, vc8), (ones, ones), kv_bytes / 2, cfg8)):
                say(f"  sweep, {label} KV (fastest first; median of {SWEEP_ROUNDS} x {SWEEP_REPS}):")
                for line in sweep(q, *caches, tables, seq_lens, qsl, scales, nbytes, label, as_key(c)):
                    say("    " + line)
        best = max(peers, key=lambda n: mult[n] / times[n][0])  # the SDPA variant with the highest bandwidth
        t_ours, t_fp8 = times["ours (paged, bf16 KV)"][0], times["ours (paged, fp8 KV)"][0]
        spread = max((hi - lo) / t for t, lo, hi in (times["ours (paged, bf16 KV)"], times[best]))
        rows.append((b, seq, gbps(kv_bytes, t_ours), gbps(kv_bytes / 2, t_fp8), best,
                     gbps(mult[best] * kv_bytes, times[best][0]), t_fp8 / t_ours, spread))
        del k, v, kc, vc, kc8, vc8, fns, peers
        torch.cuda.empty_cache()

    say("\n   B x L      ours GB/s  fp8 GB/s  SDPA GB/s  (best SDPA variant)       fp8/bf16 time  ours/SDPA  "
        "round spread")
    for b, seq, bw, bw8, name, peer, fp8, spread in rows:
        say(f"{b:4d} x {seq:<6d} {bw:9.0f} {bw8:9.0f}  {peer:9.0f}  ({name:22s})  {fp8:13.2f}  {bw / peer:9.2f}  "
            f"{spread:11.1%}")
    say("(fp8 GB/s: fp8 bytes read / time; round spread: max of (max - min) / median of the per-round medians of "
        "ours bf16 and the SDPA peer)")
    mixed = mixed_rows(g, say, copy_bandwidth())
    say("\n   B x contexts          of copy: longest first  batch order   batch order / longest first (time)")
    for b, lo, first, batch_order, ratio in mixed:
        say(f"{b:4d} x U[{lo:4d}, 2048]  {first:24.2f}  {batch_order:11.2f}  {ratio:12.2f}")
    report.save(args.out)


if __name__ == "__main__":
    sys.exit(main())
