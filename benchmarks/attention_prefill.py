"""Paged prefill attention vs torch SDPA (flash) and vs the former per-head kernel: TFLOP/s.

Shapes (sequences x new tokens [over cached tokens]): 1 x 4096, 8 x 1024, 32 x 512, 8 x 512 over 2048 cached,
with the head shapes of Qwen3-0.6B (16 query / 8 KV heads) and Llama-3-8B (32 / 8), head_dim 128, bf16.

- ours: the public op (atom_kernels.paged_attention, prefill kernel only: num_decodes=0) over a paged cache
  (block size 16, blocks shuffled). One program holds a KV head's GROUP query heads: each K/V tile read once
  per group.
- per-head: the kernel this replaced (one program per query tile and query head, each K/V tile read GROUP
  times), kept here only, at its former tile config.
- SDPA peers read the same K/V values stored contiguously, [seqs, heads, len, d]: the flash backend with GQA
  (enable_gqa, K/V not copied) and with K/V expanded to every query head (repeat_interleave outside the
  timing); cuDNN likewise where it runs (no cached prefix: SDPA's cuDNN path has no bottom-right causal mask).
  Causal masks are bottom-right aligned (torch.nn.attention.bias.causal_lower_right with a cached prefix):
  new token i sees the prefix and new tokens <= i, as ours does.
FLOPs = 4 * heads * head_dim * (keys each query sees, summed): the causal work, the same for every variant.
Every variant's output is checked against float32 math SDPA on the same values (max abs error printed).
Timing: common.gpu_times (interleaved rounds, L2 flushed before each launch, no host time inside).
A tile sweep of our kernel per shape follows (--no-sweep to skip); the default config is marked.

    python benchmarks/attention_prefill.py [--no-sweep] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import sys
import warnings

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from common import Report, gpu_times, summary
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

import atom_kernels
from atom_kernels.triton._utils import pow2
from atom_kernels.triton.attention.common import attend_tile, load_block_ids, load_kv_tile, softmax_scale
from atom_kernels.triton.attention.prefill import _find_seq, launch_prefill, prefill_config

MODELS = {"Qwen3-0.6B": (16, 8), "Llama-3-8B": (32, 8)}  # query heads, KV heads
SHAPES = [(1, 4096, 0), (8, 1024, 0), (32, 512, 0), (8, 512, 2048)]  # seqs, new tokens, cached tokens
HEAD_DIM, BLOCK = 128, 16
ROUNDS, REPS = 5, 20
SWEEP_ROUNDS, SWEEP_REPS = 2, 10
SWEEP = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 64, 4, 3), (128, 128, 8, 2), (128, 128, 8, 3), (128, 32, 4, 3),
         (64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2)]  # (block_m rows, block_n, num_warps, num_stages)


@triton.jit(do_not_specialize=["window"])
def _per_head_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, out_ptr, qk_scale, window, num_seqs,
    sq_t, sq_h, sq_d, so_t, so_h, so_d, s_bt, s_btc, skc_b, skc_t, skc_h, skc_d, svc_b, svc_t, svc_h, svc_d,
    HEAD_DIM, GROUP, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
):
    # The former prefill kernel (main at f5a1138) less fp8 and SKIP_DECODES: grid (T // BLOCK_M + num_seqs, heads).
    pid = tl.program_id(0)
    h = tl.program_id(1)
    seq = _find_seq(qsl_ptr, pid, num_seqs, BLOCK_M)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    tile = pid - (q_start // BLOCK_M + seq)
    if tile * BLOCK_M >= q_len:
        return
    prefix = tl.load(seq_lens_ptr + seq) - q_len
    i = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    i_mask = i < q_len
    q_pos = prefix + i
    d = tl.arange(0, D_PAD)
    d_mask = d < HEAD_DIM
    rows = (q_start + i).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * sq_t + h * sq_h + d[None, :] * sq_d,
                mask=i_mask[:, None] & d_mask[None, :], other=0.0)
    hi = prefix + tl.minimum((tile + 1) * BLOCK_M, q_len)
    lo = tl.where(window > 0, tl.maximum(prefix + tile * BLOCK_M - window + 1, 0), 0)
    m = tl.full([BLOCK_M], -1.0e30, tl.float32)
    den = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    kvh = (h // GROUP).to(tl.int64)
    n = lo + tl.arange(0, BLOCK_N)
    blk = load_block_ids(bt_row, s_btc, n, n < hi, BLOCK_SIZE)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < hi
        blk_next = load_block_ids(bt_row, s_btc, n + BLOCK_N, n + BLOCK_N < hi, BLOCK_SIZE)
        k = load_kv_tile(kc_ptr, blk, n, n_mask, kvh * skc_h, skc_b, skc_t, skc_d, d, d_mask, BLOCK_SIZE)
        v = load_kv_tile(vc_ptr, blk, n, n_mask, kvh * svc_h, svc_b, svc_t, svc_d, d, d_mask, BLOCK_SIZE)
        blk = blk_next
        valid = n_mask[None, :] & (n[None, :] <= q_pos[:, None])
        valid = valid & ((window <= 0) | (n[None, :] > q_pos[:, None] - window))
        m, den, acc = attend_tile(q, k, v, valid, m, den, acc, qk_scale)
    o = acc / tl.where(den > 0, den, 1.0)[:, None]
    out = out_ptr + rows[:, None] * so_t + h * so_h + d[None, :] * so_d
    tl.store(out, o.to(out_ptr.dtype.element_ty), mask=i_mask[:, None] & d_mask[None, :])


def per_head(query, kc, vc, tables, seq_lens, qsl, out):
    """The former kernel at its former 16-bit config (64 x 64 tiles, 4 warps, 2 stages)."""
    num_tokens, heads, d = query.shape
    grid = (num_tokens // 64 + seq_lens.shape[0], heads)
    _per_head_kernel[grid](
        query, kc, vc, tables, seq_lens, qsl, out, softmax_scale(d**-0.5), 0, seq_lens.shape[0],
        *query.stride(), *out.stride(), *tables.stride(), *kc.stride(), *vc.stride(), d, heads // kc.shape[2],
        BLOCK_SIZE=kc.shape[1], BLOCK_M=64, BLOCK_N=64, D_PAD=pow2(d, 16), num_warps=4, num_stages=2,
    )
    return out


def make_inputs(n, new, cached, heads, kv_heads, g, device="cuda"):
    """q [n, heads, new, d]; contiguous K/V [n, kv_heads, cached + new, d]; the same values in a shuffled paged
    cache [blocks, BLOCK, kv_heads, d] with tables [n, blocks per seq], seq_lens, query_start_loc."""
    total = cached + new
    q = torch.randn(n, heads, new, HEAD_DIM, device=device, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(n, kv_heads, total, HEAD_DIM, device=device, generator=g).to(torch.bfloat16)
            for _ in range(2))
    per_seq = triton.cdiv(total, BLOCK)
    perm = torch.randperm(n * per_seq, device=device, generator=g)
    caches = []
    for x in (k, v):  # cache[tables[i, j]] = tokens [j * BLOCK, (j + 1) * BLOCK) of sequence i
        padded = F.pad(x, (0, 0, 0, per_seq * BLOCK - total))
        blocks = padded.view(n, kv_heads, per_seq, BLOCK, HEAD_DIM).permute(0, 2, 3, 1, 4)
        cache = torch.empty(n * per_seq, BLOCK, kv_heads, HEAD_DIM, device=device, dtype=torch.bfloat16)
        cache[perm] = blocks.reshape(-1, BLOCK, kv_heads, HEAD_DIM)
        caches.append(cache)
    meta = dict(block_tables=perm.view(n, per_seq).to(torch.int32),
                seq_lens=torch.full((n,), total, dtype=torch.int32, device=device),
                query_start_loc=torch.arange(0, n * new + 1, new, dtype=torch.int32, device=device))
    return q, k, v, caches[0], caches[1], meta


def flops(n, new, cached, heads) -> float:
    """Causal work: query i of a sequence sees cached + i + 1 keys; 2 FLOPs per MAC, QK^T and PV."""
    keys_seen = n * (new * cached + new * (new + 1) // 2)
    return 4.0 * heads * HEAD_DIM * keys_seen


def peers(q, k, v, cached) -> dict:
    """name → fn for the SDPA variants that run here (see the module docstring)."""
    group = q.shape[1] // k.shape[1]
    ke, ve = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = dict(attn_mask=causal_lower_right(q.shape[2], k.shape[2])) if cached else dict(is_causal=True)
    backends = [SDPBackend.FLASH_ATTENTION] + ([] if cached else [SDPBackend.CUDNN_ATTENTION])
    found = {}
    for backend in backends:
        for label, kk, vv, gqa in (("gqa", k, v, True), ("expanded", ke, ve, False)):
            def fn(backend=backend, kk=kk, vv=vv, gqa=gqa):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=gqa, **mask)
            try:
                fn()
                torch.cuda.synchronize()
                found[f"sdpa-{backend.name.lower().split('_')[0]}-{label}"] = fn
            except RuntimeError:
                pass
    return found


def reference(q, k, v, cached) -> torch.Tensor:
    """float32 math SDPA, bottom-right causal: [n, heads, new, d]."""
    new, total = q.shape[2], k.shape[2]
    seen = torch.arange(total, device=q.device)[None, :] <= cached + torch.arange(new, device=q.device)[:, None]
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=seen, enable_gqa=True)


def run_shape(model, n, new, cached, g, sweep, say) -> tuple:
    heads, kv_heads = MODELS[model]
    q, k, v, kc, vc, meta = make_inputs(n, new, cached, heads, kv_heads, g)
    query = q.transpose(1, 2).reshape(n * new, heads, HEAD_DIM)  # the op's [tokens, heads, d]
    out = torch.empty_like(query)
    hints = dict(max_query_len=new, max_seq_len=cached + new, num_decodes=0, num_prefills=n)
    args = (query, kc, vc, meta["block_tables"], meta["seq_lens"], meta["query_start_loc"])
    fns = {"ours": lambda: atom_kernels.paged_attention(*args, HEAD_DIM**-0.5, out=out, **hints),
           "per-head": lambda: per_head(*args, out)}
    with warnings.catch_warnings():  # SDPA explains at length why a backend declines
        warnings.simplefilter("ignore")
        fns |= peers(q, k, v, cached)
    want = reference(q, k, v, cached)
    errs = {}
    for name, fn in fns.items():
        got = fn()
        got = got.view(n, new, heads, HEAD_DIM).transpose(1, 2) if got.dim() == 3 else got
        errs[name] = (got.float() - want).abs().max().item()
    del want
    timed, failed = gpu_times(fns, ROUNDS, REPS)
    work = flops(n, new, cached, heads)
    tflops = {name: work / (summary(ts, ROUNDS)[0] * 1e-3) / 1e12 for name, ts in timed.items()}
    title = f"{n} x {new}" + (f" over {cached} cached" if cached else "")
    say(f"\n{model} ({heads}/{kv_heads} heads), {title}: {work / 1e12:.3f} TFLOP; "
        f"prefill_config {prefill_config(new, HEAD_DIM, False, heads // kv_heads)}")
    say(f"  {'':22s} {'median':>9s}  {'TFLOP/s':>7s}  {'max err':>8s}  per-round medians")
    for name, ts in timed.items():
        med, lo, hi = summary(ts, ROUNDS)
        say(f"  {name:22s} {med * 1e3:9.1f} us {tflops[name]:7.1f}  {errs[name]:8.2e}  "
            f"{lo * 1e3:.1f}..{hi * 1e3:.1f} us ({(hi - lo) / med:.1%})")
    for name, err in failed.items():
        say(f"  {name:22s} failed: {err}")
    if sweep:
        say(f"  tile sweep of ours (fastest first; median of {SWEEP_ROUNDS} x {SWEEP_REPS}):")
        for line in sweep_lines(args, out, work, heads // kv_heads, new):
            say("    " + line)
    flash = max(((t, n) for n, t in tflops.items() if n.startswith("sdpa-flash")), default=(None, "none ran"))
    best = max(((t, n) for n, t in tflops.items() if n.startswith("sdpa")), default=(None, "none ran"))
    return (model, title, tflops.get("ours"), tflops.get("per-head"), flash, best)


def fmt(x: float | None, width: int) -> str:
    return f"{x:{width}.1f}" if x is not None else f"{'n/a':>{width}s}"


def ratio(a: float | None, b: float | None, width: int) -> str:
    return f"{a / b:{width}.2f}" if a is not None and b is not None else f"{'n/a':>{width}s}"


def sweep_lines(args, out, work, group, new) -> list[str]:
    default = prefill_config(new, HEAD_DIM, False, group)
    fns = {cfg: functools.partial(launch_prefill, *args, softmax_scale(HEAD_DIM**-0.5), 0, None, None, out,
                                  False, *cfg) for cfg in SWEEP}
    times, failed = gpu_times(fns, SWEEP_ROUNDS, SWEEP_REPS)
    rows = [(float("inf"), f"{cfg}: {err}") for cfg, err in failed.items()]
    for cfg, ts in times.items():
        med, lo, hi = summary(ts, SWEEP_ROUNDS)
        mark = "  <- prefill_config" if cfg == tuple(default.values()) else ""
        rows.append((med, f"block_m={cfg[0]:3d} block_n={cfg[1]:3d} warps={cfg[2]} stages={cfg[3]}: "
                          f"{med * 1e3:8.1f} us {work / (med * 1e-3) / 1e12:6.1f} TFLOP/s "
                          f"(rounds {lo * 1e3:.1f}..{hi * 1e3:.1f}){mark}"))
    return [line for _, line in sorted(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-sweep", action="store_true", help="skip the tile sweep of our kernel")
    report = Report("attention_prefill", parser)
    say = report.say
    args = parser.parse_args()
    say(report.header())
    say(f"head_dim {HEAD_DIM}, bf16, paged block size {BLOCK}; median of {ROUNDS} interleaved rounds x {REPS} "
        f"launches, L2 flushed before each")
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = [run_shape(model, *shape, g, not args.no_sweep, say) for model in MODELS for shape in SHAPES]
    say(f"\n{'model':11s} {'shape':24s} {'ours':>6s} {'per-head':>8s} {'flash':>6s} {'best SDPA':>9s} "
        f"{'(variant)':22s} {'ours/per-head':>13s} {'ours/flash':>10s} {'ours/best':>9s}   (TFLOP/s)")
    for model, title, ours, old, (flash, _), (best, best_name) in rows:
        say(f"{model:11s} {title:24s} {fmt(ours, 6)} {fmt(old, 8)} {fmt(flash, 6)} {fmt(best, 9)} "
            f"({best_name:20s}) {ratio(ours, old, 13)} {ratio(ours, flash, 10)} {ratio(ours, best, 9)}")
    report.save(args.out)


if __name__ == "__main__":
    sys.exit(main())
