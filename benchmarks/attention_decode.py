"""Paged decode attention vs torch SDPA: achieved KV bandwidth, and fp8-KV vs bf16-KV decode time.

For B x L in {32x4096, 128x2048, 8x16384}, 16 query / 8 KV heads, head_dim 128, bf16: our Triton decode
reads a paged cache (block size 16, blocks shuffled); torch SDPA reads the same K/V stored contiguously
([B, kv_heads, L, d], GQA through enable_gqa, each SDPA backend that accepts it, and also with K/V
expanded to 16 heads). Bandwidth = bytes of K+V actually read / time (triton.testing.do_bench, which
flushes L2 between runs). The ratio is ours / the SDPA variant with the highest bandwidth (goal >= 0.9);
fp8/bf16 is our decode time with an fp8 e4m3 cache over that with a bf16 cache (goal <= 0.6).

    python benchmarks/attention_decode.py [--sweep] [--out FILE]

--sweep also times a grid of decode launch configs per shape (to tune decode_config).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import itertools
import re
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

import atom_kernels
from atom_kernels.triton.attention_common import softmax_scale
from atom_kernels.triton.attention_decode import decode_config, launch_decode

SHAPES = [(32, 4096), (128, 2048), (8, 16384)]
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 16


def paged_inputs(b: int, seq: int, dtype: torch.dtype, g: torch.Generator):
    """Contiguous K/V [b, kv_heads, seq, d] and the same values in a shuffled paged cache."""
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
        cache = torch.empty(b * per_seq, BLOCK, KV_HEADS, HEAD_DIM, device=dev, dtype=dtype)
        cache[perm] = blocks.reshape(-1, BLOCK, KV_HEADS, HEAD_DIM).to(dtype)
        caches.append(cache)
    return k, v, caches[0], caches[1], tables


def bench(fn, rep: int = 200) -> float:
    """Median milliseconds."""
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def ours(q, kc, vc, tables, seq_lens, qsl, seq, scales=(None, None)):
    hints = dict(max_query_len=1, max_seq_len=seq, num_decodes=q.shape[0], num_prefills=0)
    out = torch.empty_like(q)
    return lambda: atom_kernels.paged_attention(q, kc, vc, tables, seq_lens, qsl, HEAD_DIM**-0.5,
                                                k_scale=scales[0], v_scale=scales[1], out=out, **hints)


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


def check_close(q, k, v, fn) -> float:
    """Max abs difference of our output vs SDPA on the same data (sanity, printed)."""
    ref = F.scaled_dot_product_attention(q.unsqueeze(2).float(), k.float(), v.float(), enable_gqa=True)
    return (fn().float() - ref.squeeze(2)).abs().max().item()


def sweep(q, kc, vc, tables, seq_lens, qsl, scales, nbytes) -> list[tuple[float, str]]:
    """(ms, description) of every decode launch config in a small grid, fastest first."""
    results = []
    out = torch.empty_like(q)
    for cfg in itertools.product((1, 2, 3, 4, 6, 8, 12, 16), (64, 128), (4,), (2, 3, 4, 5)):
        name = "splits={:2d} block_n={:3d} warps={} stages={}".format(*cfg)
        fn = functools.partial(launch_decode, q, kc, vc, tables, seq_lens, qsl,
                               softmax_scale(HEAD_DIM**-0.5), 0, *scales, out, *cfg)
        try:
            ms = bench(fn, rep=40)
        except Exception as e:  # e.g. out of shared memory for a big tile
            results.append((float("inf"), f"{name}: {type(e).__name__}"))
            continue
        results.append((ms, f"{name}: {ms * 1e3:8.1f} us {gbps(nbytes, ms):6.0f} GB/s"))
    return sorted(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--out", help="also write the output to this file (default: benchmarks/results/"
                        "attention_decode-<date>-<gpu>.txt)")
    args = parser.parse_args()
    lines: list[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    gpu, versions = torch.cuda.get_device_name(), f"torch {torch.__version__}, triton {triton.__version__}"
    say(f"attention_decode {datetime.date.today()} {gpu}, {versions}")
    say(f"heads {HEADS}/{KV_HEADS}, head_dim {HEAD_DIM}, bf16 queries, paged block size {BLOCK}")
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for b, seq in SHAPES:
        q = torch.randn(b, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v, kc, vc, tables = paged_inputs(b, seq, torch.bfloat16, g)
        seq_lens = torch.full((b,), seq, dtype=torch.int32, device="cuda")
        qsl = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        kv_bytes = 2 * k.numel() * k.element_size()
        fn = ours(q, kc, vc, tables, seq_lens, qsl, seq)
        err = check_close(q, k, v, fn)
        t_ours = bench(fn)
        with warnings.catch_warnings():  # SDPA explains at length why a backend declines GQA
            warnings.simplefilter("ignore")
            peers = {name: (bench(f), mult) for name, (f, mult) in sdpa_variants(q, k, v).items()}
        # the peer: the SDPA variant with the highest achieved bandwidth (bytes it reads / its time)
        best_name, (t_peer, mult) = max(peers.items(), key=lambda kv: kv[1][1] / kv[1][0])
        ones = torch.ones((), device="cuda")
        kc8, vc8 = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
        t_fp8 = bench(ours(q, kc8, vc8, tables, seq_lens, qsl, seq, (ones, ones)))
        cfg = decode_config(b, KV_HEADS, seq, HEAD_DIM, q.device)
        cfg8 = decode_config(b, KV_HEADS, seq, HEAD_DIM, q.device, torch.float8_e4m3fn)
        say(f"\nB={b} L={seq}: KV {kv_bytes / 1e6:.0f} MB (bf16), max|ours - sdpa| {err:.2e}")
        say(f"  decode_config bf16 {cfg}, fp8 {cfg8}")
        for name, (t, m) in peers.items():
            say(f"  {name:28s} {t * 1e3:8.1f} us  {gbps(m * kv_bytes, t):6.0f} GB/s")
        say(f"  {'ours (paged, bf16 KV)':28s} {t_ours * 1e3:8.1f} us  {gbps(kv_bytes, t_ours):6.0f} GB/s")
        say(f"  {'ours (paged, fp8 KV)':28s} {t_fp8 * 1e3:8.1f} us  {gbps(kv_bytes / 2, t_fp8):6.0f} GB/s")
        if args.sweep:
            for label, caches, scales, nbytes in (("bf16", (kc, vc), (None, None), kv_bytes),
                                                  ("fp8", (kc8, vc8), (ones, ones), kv_bytes / 2)):
                say(f"  sweep, {label} KV (fastest first):")
                for _, line in sweep(q, *caches, tables, seq_lens, qsl, scales, nbytes):
                    say("    " + line)
        peer_bw = gbps(mult * kv_bytes, t_peer)
        rows.append((b, seq, gbps(kv_bytes, t_ours), best_name, peer_bw, t_fp8 / t_ours))
        del k, v, kc, vc, kc8, vc8
        torch.cuda.empty_cache()

    say("\n   B x L      ours GB/s  SDPA GB/s  (best SDPA variant)           fp8/bf16 time  ours/SDPA")
    for b, seq, bw, name, peer, fp8 in rows:
        say(f"{b:4d} x {seq:<6d} {bw:9.0f}  {peer:9.0f}  ({name:26s})  {fp8:13.2f}  {bw / peer:9.2f}")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-")
    name = f"attention_decode-{datetime.date.today()}-{slug}.txt"
    path = Path(args.out or Path(__file__).parent / "results" / name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"saved {path}")


if __name__ == "__main__":
    sys.exit(main())
