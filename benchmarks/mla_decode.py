"""MLA decode over a paged latent cache: latent-cache bandwidth of our Triton kernel vs the device copy bandwidth
and torch, bf16 and fp8 latent caches.

For B x L in {64x4096, 128x2048, 16x16384}, 16 and 128 heads, latent 512 + 64, block size 16 with shuffled
blocks, bf16 queries: our decode through the public op (dispatcher, checks, mla_decode_config; the step's MLA
decode metadata made once, as every layer of a step shares it). Bandwidth = latent-cache bytes read / time
(each row once); "of copy" = that over the device copy bandwidth measured in this run (read + write of a 2 GiB
copy). TFLOP/s counts 2 * B * H * L * (576 + 512). Peers over the same latent values, same run:
  - "torch bmm": absorbed decode in bf16 matmuls over a contiguous [B, L, 576] latent (logits, softmax, P @ V),
  - "reference": atom_kernels.reference.mla_attention over the same paged cache (float32 math, the test
    oracle); skipped where its float32 copies (GQA expands the latent per head) would exceed REF_BYTES,
  - "FlashMLA": DeepSeek's FlashMLA as vLLM's GPU build ships it (Hopper only; its own page block 64, shuffled),
    bf16 and fp8 latent (fp8 queries, per-tensor scales 1, as vLLM's FlashMLA backend runs it); skipped with the
    reason where vLLM or a Hopper GPU is missing.
Then batches of mixed context lengths (MIXED, uniform in [256, 4096]) launched longest first vs in batch order.
A mini-sweep of heads per program (BLOCK_H 16/32/64) of the Triton kernel shows what the default config leaves on
the table; on an H100 the default ("ours") is one of Hopper's wgmma kernels (mla_hopper_few_heads up to 32 heads,
mla_decode_hopper above), so there the BLOCK_H rows are the Triton kernel they replaced.
Goals: >= 0.8 of copy bandwidth; fp8 <= 0.6 of bf16 time. With 128 heads the decode does 242 flops per byte
of bf16 latent: at ~2.8 TB/s that is ~700 TFLOP/s, near the H100's dense bf16 peak, so that case is
compute-bound (the TFLOP/s column says how close).

    python benchmarks/mla_decode.py [--sweep [--quick]] [--out FILE]

--sweep also times a grid of decode launch configs (heads per program, tile rows, warps, stages, splits, and
the decode kernel's prefetch / f8_bits switches) per case, to tune mla_decode_config (compiles ~250 kernels:
many minutes). --quick: the 64 x 4096 case only and a small grid around the current configs (~70 kernels,
about 2 minutes), every config listed fastest first per heads and cache dtype.

Timing: common.gpu_times (interleaved rounds, L2 flushed before each launch, reps queued behind a
GPU sleep); median of all reps.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys

import torch
import triton
from common import Report, copy_bandwidth, gpu_times, shuffled_tables, summary

import atom_kernels
from atom_kernels import reference
from atom_kernels.reference.mla import mla_decode_metadata
from atom_kernels.triton.attention.common import softmax_scale
from atom_kernels.triton.attention.decode import decode_order, pick_splits
from atom_kernels.triton.mla.decode import (
    launch_mla_decode,
    mla_decode_config,
    resident_programs,
    wgmma_fits,
)

SHAPES = [(64, 4096), (128, 2048), (16, 16384)]
MIXED = [(512, 16), (128, 128), (256, 128)]  # (sequences, heads): more programs than one wave on an H100
DEVICE = "cuda"
HEADS = (16, 128)
R, ROPE, BLOCK = 512, 64, 16
FP8 = torch.float8_e4m3fn
ROUNDS, REPS = 5, 20
REF_BYTES = 24 << 30  # the reference's float32 gathers: skip it above this
SCALE = (128 + ROPE) ** -0.5  # DeepSeek's qk_head_dim 192


def paged_latent(b: int, seq: int, g: torch.Generator):
    """Contiguous latent [b, seq, 576] (bf16) and the same rows in a paged cache with shuffled blocks."""
    lat = torch.randn(b, seq, R + ROPE, device=DEVICE, dtype=torch.bfloat16, generator=g)
    per_seq = seq // BLOCK
    perm = torch.randperm(b * per_seq, device=DEVICE, generator=g)
    cache = torch.empty(b * per_seq, BLOCK, R + ROPE, device=DEVICE, dtype=torch.bfloat16)
    cache[perm] = lat.view(b * per_seq, BLOCK, R + ROPE)
    return lat, cache, perm.view(b, per_seq).to(torch.int32)


def ours(q, cache, tables, seq_lens, qsl, seq, scale=None):
    """The public op as a model step runs it (decode metadata made by the first call, memoised)."""
    hints = dict(max_query_len=1, max_seq_len=seq, num_decodes=q.shape[0], num_prefills=0)
    out = q.new_empty(*q.shape[:2], R)
    scratch: dict = {}
    return lambda: atom_kernels.mla_attention(q, cache, tables, seq_lens, qsl, SCALE, R, scale, out, scratch,
                                              **hints)


def with_config(q, cache, tables, seq_lens, qsl, seq, block_h, scale=None, **forced):
    """Our Triton decode kernel (not Hopper's wgmma one unless forced) with BLOCK_H (and any other launch setting)
    forced; the rest as mla_decode_config picks them, the split count for the number of head groups."""
    meta = mla_decode_metadata(tables, seq_lens, BLOCK)
    cfg = picked_config(q, cache, seq)
    programs = q.shape[0] * triton.cdiv(q.shape[1], block_h)
    splits = pick_splits(programs, resident_programs(False, q.device), triton.cdiv(seq, 256))
    cfg.update(block_h=block_h, num_warps=4 if block_h <= 16 else 8, num_splits=splits, wgmma=False)
    cfg.update(forced)
    out = q.new_empty(*q.shape[:2], R)
    return lambda: launch_mla_decode(q, cache, *meta, seq_lens, qsl, softmax_scale(SCALE), R, scale, out, **cfg)


def picked_config(q, cache, seq: int) -> dict:
    """mla_decode_config as the op calls it for these arguments."""
    fits = wgmma_fits(q, cache, R, q.new_empty(*q.shape[:2], R))
    return mla_decode_config(q.shape[0], q.shape[1], seq, q.device, q.dtype, cache.dtype, fits)


def sweep_configs(q, seq, fp8: bool, quick: bool) -> list[dict]:
    """The --sweep grid for one case and cache dtype: launch settings for with_config.

    Heads per program 16/32/64 (--quick: mla_decode_config's only); tile rows 16/32/64 (--quick at 64 heads per
    program: 32/64, 16 was far behind in the H100 sweep); 4 or 8 warps at 16 heads per program (8 leaves the
    fp8 paths without register spills, ptxas), else 8; the split count with_config picks and twice that (--quick:
    once). Without prefetch: 1, 2, 3 stages (--quick: 2, 3). With prefetch: 1 stage only, as its loads are left
    alone by the pipeliner (ptxas: the same code at 1 and 3 stages). f8_bits off and on for fp8.
    """
    heads = q.shape[1]
    default_bh = picked_config(q, q.new_empty(1, BLOCK, R + ROPE), seq)["block_h"]
    variants = [(s, False) for s in ((2, 3) if quick else (1, 2, 3))] + [(1, True)]
    cfgs = []
    for bh in (b for b in (16, 32, 64) if b <= triton.next_power_of_2(heads) and (not quick or b == default_bh)):
        tiles = [(bn, w) for bn in ((32, 64) if quick and bh == 64 else (16, 32, 64))
                 for w in ((4, 8) if bh == 16 else (8,))]
        n = pick_splits(q.shape[0] * triton.cdiv(heads, bh), resident_programs(False, q.device), triton.cdiv(seq, 256))
        cfgs += [dict(block_h=bh, block_n=bn, num_warps=w, num_stages=stages, num_splits=n * mult, prefetch=pf,
                      f8_bits=bits)
                 for bn, w in tiles for stages, pf in variants for bits in ((False, True) if fp8 else (False,))
                 for mult in ((1,) if quick else (1, 2))]
    return cfgs


def sweep(q, caches, tables, seq_lens, qsl, seq, nbytes, quick=False) -> list[str]:
    """--sweep: the grid of sweep_configs per cache dtype, fastest first (8 lines each; --quick: all), then the
    best fp8 time over the best bf16 time."""
    lines, best = [], {}
    for dt, (cache, scale) in caches.items():
        fns = {}
        for cfg in sweep_configs(q, seq, dt == "fp8", quick):
            name = " ".join(f"{k.removeprefix('num_')}={int(v)}" for k, v in cfg.items())
            fns[name] = with_config(q, cache, tables, seq_lens, qsl, seq, scale=scale, **cfg)
        timed, failed = gpu_times(fns, 2, 10)
        ranked = sorted((summary(ts, 2)[0], n) for n, ts in timed.items())
        lines.append(f"  sweep {dt} (fastest first, median of 2 x 10): " + ("" if not failed else
                     f"{len(failed)} configs failed ({', '.join(sorted(set(failed.values())))})"))
        lines += [f"    {n:72s} {t * 1e3:8.1f} us {nbytes[dt] / (t * 1e-3) / 1e9:6.0f} GB/s"
                  for t, n in (ranked if quick else ranked[:8])]
        if ranked:
            best[dt] = ranked[0][0]
    if len(best) == 2:
        lines.append(f"  sweep best fp8 / best bf16: {best['fp8'] / best['bf16']:.2f} (goal <= 0.60)")
    return lines


def mixed_rows(g: torch.Generator, say, copy_bw: float) -> None:
    """Decode batches of mixed context lengths (uniform in [256, 4096], bf16 latent) with more programs than one wave:
    the kernel mla_decode_config picks, launched longest first (decode_order, as the op does) vs in batch order,
    same run; fraction of copy bandwidth."""
    rng = random.Random(0)
    say("\nmixed context lengths (uniform in [256, 4096]), bf16 latent: longest first vs batch order")
    for b, heads in MIXED:
        lens = [rng.randint(256, 4096) for _ in range(b)]
        tables, num_blocks = shuffled_tables(lens, g)  # the same block size (16)
        cache = torch.randn(num_blocks, BLOCK, R + ROPE, device=DEVICE, generator=g).to(torch.bfloat16)
        q = torch.randn(b, heads, R + ROPE, device=DEVICE, dtype=torch.bfloat16, generator=g) * 0.5
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        qsl = torch.arange(b + 1, dtype=torch.int32, device=DEVICE)
        meta = mla_decode_metadata(tables, seq_lens, BLOCK)
        cfg = picked_config(q, cache, max(lens))
        order = decode_order(seq_lens, triton.cdiv(heads, cfg["block_h"]) * cfg["num_splits"],
                             resident_programs(cfg["wgmma"], q.device), {})
        kernel = "wgmma" if cfg["wgmma"] else f"Triton BLOCK_H={cfg['block_h']}"
        if order is None:
            say(f"  {b:4d} sequences, {heads:3d} heads ({kernel}): one wave, no order")
            continue
        outs = [q.new_empty(b, heads, R) for _ in range(2)]
        args = (q, cache, *meta, seq_lens, qsl, softmax_scale(SCALE), R, None)
        fns = {"longest first": functools.partial(launch_mla_decode, *args, outs[0], **cfg, order=order),
               "batch order": functools.partial(launch_mla_decode, *args, outs[1], **cfg, order=None)}
        for fn in fns.values():
            fn()
        assert torch.equal(outs[0], outs[1]), "the launch order changed the result"
        timed, failed = gpu_times(fns, ROUNDS, REPS)
        assert not failed, failed
        t = {n: summary(ts, ROUNDS)[0] for n, ts in timed.items()}
        frac = {n: sum(lens) * (R + ROPE) * 2 / (t[n] * 1e-3) / copy_bw for n in t}
        say(f"  {b:4d} sequences, {heads:3d} heads ({kernel}, {cfg['num_splits']} splits): " + ", ".join(
            f"{n} {t[n] * 1e3:.1f} us ({frac[n]:.2f} of copy)" for n in t)
            + f"; batch order / longest first {t['batch order'] / t['longest first']:.2f}")
        del cache
        torch.cuda.empty_cache()


def torch_bmm(q, lat):
    """Absorbed decode in bf16 matmuls over a contiguous latent: [B, H, 576] x [B, L, 576] → [B, H, 512]."""
    def fn():
        p = torch.softmax(torch.bmm(q, lat.transpose(1, 2)).float() * SCALE, -1).to(q.dtype)  # [B, H, L]
        return torch.bmm(p, lat[..., :R])
    return fn


def flashmla(q, lat, g: torch.Generator, fp8: bool):
    """(FlashMLA's decode over the latent rows of lat in its own shuffled page-64 cache, None) or (None, why)."""
    try:
        from vllm.v1.attention.ops import flashmla as fm
    except Exception as e:  # noqa: BLE001 - the peer is optional, its absence is printed
        return None, f"no vLLM ({type(e).__name__})"
    ok, why = fm.is_flashmla_dense_supported()
    if not ok:
        return None, why
    b, seq = lat.shape[:2]
    per_seq = seq // 64
    perm = torch.randperm(b * per_seq, device=DEVICE, generator=g)
    cache = torch.empty(b * per_seq, 64, 1, R + ROPE, device=DEVICE, dtype=FP8 if fp8 else lat.dtype)
    cache[perm] = lat.view(b * per_seq, 64, 1, R + ROPE).to(cache.dtype)
    tables = perm.view(b, per_seq).to(torch.int32)
    seq_lens = torch.full((b,), seq, dtype=torch.int32, device=DEVICE)
    q4 = q.unsqueeze(1)  # [B, 1, H, 576]: one query token per sequence
    if not fp8:
        sched, _ = fm.get_mla_metadata()
        return (lambda: fm.flash_mla_with_kvcache(q4, cache, tables, seq_lens, R, sched, softmax_scale=SCALE,
                                                  causal=True)[0].squeeze(1)), None
    sched, splits = fm.get_mla_metadata_dense_fp8(seq_lens, q.shape[1], 1)
    one, q8 = torch.ones(1, device=DEVICE), q4.to(FP8)
    return (lambda: fm.flash_mla_with_kvcache_fp8(q8, cache, tables, seq_lens, R, sched, splits, SCALE, True, one,
                                                  one)[0].squeeze(1)), None


def reference_fn(q, cache, tables, seq_lens, qsl, scale=None):
    scratch: dict = {}
    return lambda: reference.mla_attention(q, cache, tables, seq_lens, qsl, SCALE, R, scale, plan_cache=scratch)


def peer_cells(med: dict, flops: int) -> str:
    """The FlashMLA columns of the summary row: bf16 / fp8 microseconds and the bf16 TFLOP/s (- where skipped)."""
    us = " / ".join(f"{med[n] * 1e3:.1f}" if n in med else "-" for n in ("FlashMLA bf16", "FlashMLA fp8"))
    tf = f"{flops / (med['FlashMLA bf16'] * 1e-3) / 1e12:.0f}" if "FlashMLA bf16" in med else "-"
    return f"{us:>22s} {tf:>8s}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time a grid of decode launch configs")
    parser.add_argument("--quick", action="store_true", help="with --sweep: the 64 x 4096 case, a small grid")
    report = Report("mla_decode", parser)
    say = report.say
    args = parser.parse_args()
    say(report.header())
    say(f"latent {R} + {ROPE}, block size {BLOCK} (shuffled), bf16 queries; median of {ROUNDS} interleaved rounds "
        f"x {REPS} launches, L2 flushed before each")
    copy_bw = copy_bandwidth()
    say(f"device copy bandwidth: {copy_bw / 1e9:.0f} GB/s (read + write of a 2 GiB copy)")
    g = torch.Generator(device=DEVICE).manual_seed(0)
    ones = torch.ones((), device=DEVICE)
    rows = []
    for b, seq in SHAPES[:1] if args.quick else SHAPES:
        lat, cache, tables = paged_latent(b, seq, g)
        cache8 = cache.to(FP8)
        seq_lens = torch.full((b,), seq, dtype=torch.int32, device=DEVICE)
        qsl = torch.arange(b + 1, dtype=torch.int32, device=DEVICE)
        for heads in HEADS:
            q = torch.randn(b, heads, R + ROPE, device=DEVICE, dtype=torch.bfloat16, generator=g) * 0.5
            fns = {"ours bf16": ours(q, cache, tables, seq_lens, qsl, seq),
                   "ours fp8": ours(q, cache8, tables, seq_lens, qsl, seq, ones),
                   "torch bmm bf16": torch_bmm(q, lat)}
            for bh in (16, 32, 64):
                if bh <= triton.next_power_of_2(heads):
                    fns[f"BLOCK_H={bh} bf16"] = with_config(q, cache, tables, seq_lens, qsl, seq, bh)
                    fns[f"BLOCK_H={bh} fp8"] = with_config(q, cache8, tables, seq_lens, qsl, seq, bh, ones)
            peer_notes = []
            for dt in ("bf16", "fp8"):
                fn, why = flashmla(q, lat, g, dt == "fp8")
                if fn is None:
                    peer_notes.append(f"FlashMLA {dt} skipped: {why}")
                else:
                    fns[f"FlashMLA {dt}"] = fn
            ref_bytes = b * seq * (R + ROPE) * 4 * (heads + 2)
            ref_note = f"reference skipped: ~{ref_bytes / 2**30:.0f} GiB of float32 copies > {REF_BYTES >> 30} GiB"
            if ref_bytes <= REF_BYTES:
                fns["reference"] = reference_fn(q, cache, tables, seq_lens, qsl)
                ref_note = ""
            want = torch_bmm(q.float(), lat.float())()
            errs = {}
            for n in [n for n in fns if n.startswith(("ours", "FlashMLA"))]:
                try:
                    errs[n] = f"{(fns[n]().float() - want).abs().max().item():.2e}"
                except Exception as e:  # noqa: BLE001 - reported, and gpu_times reports it again
                    errs[n] = f"failed ({type(e).__name__}: {str(e)[:200]})"
            timed, failed = gpu_times(fns, ROUNDS, REPS)
            med = {n: summary(ts, ROUNDS)[0] for n, ts in timed.items()}
            nbytes = {"bf16": b * seq * (R + ROPE) * 2, "fp8": b * seq * (R + ROPE)}
            flops = 2 * b * heads * seq * (R + ROPE + R)
            cfg = picked_config(q, cache, seq)
            say(f"\nB={b} L={seq} heads={heads}: latent {nbytes['bf16'] / 1e6:.0f} MB (bf16); max|x - fp32 torch| "
                + ", ".join(f"{n} {e}" for n, e in errs.items()) + f" (fp8 rounding included); mla_decode_config {cfg}")
            for note in [ref_note] + peer_notes:
                if note:
                    say(f"  {note}")
            for n, err in failed.items():
                say(f"  {n:18s} failed: {err}")
            for n, t in med.items():
                dt = "fp8" if "fp8" in n else "bf16"
                bw = nbytes[dt] / (t * 1e-3)
                say(f"  {n:18s} {t * 1e3:9.1f} us {bw / 1e9:7.0f} GB/s {bw / copy_bw:5.2f} of copy "
                    f"{flops / (t * 1e-3) / 1e12:6.1f} TFLOP/s")
            if args.sweep:
                for line in sweep(q, {"bf16": (cache, None), "fp8": (cache8, ones)}, tables, seq_lens, qsl, seq,
                                  nbytes, args.quick):
                    say(line)
            best = {dt: min((t, n) for n, t in med.items() if n.startswith("BLOCK_H") and dt in n) for dt in
                    ("bf16", "fp8") if any(n.startswith("BLOCK_H") and dt in n for n in med)}
            rows.append((b, seq, heads, med, nbytes, flops, best))
        del lat, cache, cache8
        torch.cuda.empty_cache()

    mixed_rows(g, say, copy_bw)

    say("\n   B x L     heads  ours bf16 us  GB/s  of copy  TFLOP/s  ours fp8 us  of copy  fp8/bf16  "
        "torch bmm us  reference us  FlashMLA bf16 / fp8 us  TFLOP/s  best BLOCK_H bf16 / fp8")
    for b, seq, heads, med, nbytes, flops, best in rows:
        t16, t8 = med.get("ours bf16"), med.get("ours fp8")
        if t16 is None or t8 is None:
            say(f"{b:4d} x {seq:<6d} {heads:4d}  ours failed")
            continue
        ref = f"{med['reference'] * 1e3:12.0f}" if "reference" in med else f"{'skipped':>12s}"
        bst = " / ".join(f"{n.split()[0].split('=')[1]} ({t * 1e3:.0f} us)" for t, n in best.values())
        say(f"{b:4d} x {seq:<6d} {heads:4d}  {t16 * 1e3:12.1f} {nbytes['bf16'] / (t16 * 1e-3) / 1e9:5.0f} "
            f"{nbytes['bf16'] / (t16 * 1e-3) / copy_bw:8.2f} {flops / (t16 * 1e-3) / 1e12:8.0f} {t8 * 1e3:12.1f} "
            f"{nbytes['fp8'] / (t8 * 1e-3) / copy_bw:8.2f} {t8 / t16:9.2f} "
            f"{med.get('torch bmm bf16', float('nan')) * 1e3:13.1f} {ref}  {peer_cells(med, flops)}  {bst}")
    say(f"(copy bandwidth {copy_bw / 1e9:.0f} GB/s; goals: ours >= 0.80 of copy, fp8/bf16 <= 0.60, 128 heads >= 660 "
        "TFLOP/s; reference = atom_kernels.reference.mla_attention, float32, skipped where its copies would not fit)")
    say("ours / FlashMLA time, bf16 and fp8 per row: " + "; ".join(
        f"{b}x{seq} H{heads} " + " / ".join(f"{med[f'ours {dt}'] / med[f'FlashMLA {dt}']:.2f}" if
                                            f"FlashMLA {dt}" in med and f"ours {dt}" in med else "-" for dt in
                                            ("bf16", "fp8")) for b, seq, heads, med, *_ in rows))
    report.save(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
