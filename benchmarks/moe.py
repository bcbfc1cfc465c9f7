"""Fused MoE experts vs the torch reference and transformers' Qwen3-MoE block: time, bandwidth, TFLOP/s.

A Qwen3-30B-A3B-shaped layer (hidden 2048, 128 experts, top-8, expert intermediate 768, bf16) at 1, 32, 256
and 4096 tokens. One transformers Qwen3MoeSparseMoeBlock holds the weights (random, std 1/sqrt(fan-in)) and
routes the tokens (its own router: softmax, top-8, norm_topk_prob); every implementation uses those weights.
Rows:
  ours                        atom_kernels' Triton fused_moe on the block's routing (experts only)
  ours, CUDA graph            the same call replayed from a CUDA graph, as the native engine and vLLM run decode
  torch reference             atom_kernels.reference.fused_moe (experts only)
  hf experts eager            transformers' experts module, eager loop over experts (experts only; the default
                              of a block built from a config, i.e. _experts_implementation None)
  hf experts grouped_mm       the same module with experts_implementation="grouped_mm" (torch grouped GEMM;
                              the default transformers 5 picks in from_pretrained)
  ours + hf router            transformers' router, then ours: the whole block's work
  hf block eager / grouped_mm Qwen3MoeSparseMoeBlock.forward (router + experts)
Bandwidth: bytes of the expert weights the routing touches (experts hit x 3 x H x I x 2 bytes) / our time, as a
fraction of the device's copy bandwidth measured in the same run (a 2 GiB device-to-device copy, counted as
read + write bytes, i.e. DRAM traffic). TFLOP/s: 2 * T * K * 3 * H * I / time. Timing: common's
gpu_times (CUDA events, a warm-up call, interleaved rounds, L2 flushed by a read before each launch, median);
implementations that sync with the CPU (reference, hf eager) are timed by the wall clock between syncs instead
(their times include those syncs). Goals: >= 0.6 of copy bandwidth at 1 and 32 tokens, >= 300 TFLOP/s at 4096.

    python benchmarks/moe.py [--check] [--sweep] [--profile] [--fp8] [--out FILE]

--check first compares ours with the reference and with transformers' block (outside code) at every token count
and stops on a mismatch. --sweep also times a few other tile configs per token count (to tune moe_config).
--profile prints, per token count, the GPU time of each kernel of one call of ours (torch.profiler, mean of 20).
--fp8 adds the block's experts in e4m3 with 128x128 block scales (quantized as the FP8 releases are) and the rows
  ours fp8 [weights-only] [, CUDA graph]  atom_kernels' Triton fp8_fused_moe, activations quantized per token and
                                          128 columns (the releases' scheme) or not at all
  vllm fp8                                vLLM's Triton fused_experts on the same fp8 experts, where vllm imports
whose bandwidth counts e4m3 bytes plus atom-core's scales (4 bytes per 128 weights per row); --check then also
compares ours fp8 with the fp8 torch reference. A last table compares them with ours in bf16.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch
import transformers
from common import COPY_BYTES, FLUSH_BYTES, Report, copy_bandwidth, flush_l2, gpu_times, summary
from transformers.models.qwen3_moe import modeling_qwen3_moe as qm

from atom_kernels import reference
from atom_kernels.triton.moe import fused_moe, moe_config
from atom_kernels.triton.moe.fp8 import fp8_fused_moe

H, E, K, INTER = 2048, 128, 8, 768
TOKENS = (1, 32, 256, 4096)
ROUNDS, REPS = 5, 20
SWEEP = [  # (block_m, up: (BLOCK_N, BLOCK_K, warps, stages), down: (...))
    (16, (64, 128, 4, 4), (64, 128, 4, 4)),
    (16, (32, 256, 4, 3), (64, 256, 4, 3)),
    (16, (16, 256, 4, 4), (32, 256, 4, 4)),
    (32, (64, 64, 4, 4), (128, 64, 4, 4)),
    (64, (64, 64, 4, 4), (128, 64, 4, 4)),
    (64, (128, 64, 8, 3), (128, 64, 4, 4)),
    (128, (64, 64, 8, 3), (128, 64, 8, 3)),
    (128, (128, 64, 8, 3), (256, 64, 8, 3)),
    (128, (64, 64, 8, 4), (128, 128, 8, 3)),
    (128, (64, 64, 8, 4), (256, 64, 8, 3)),
    (128, (128, 64, 8, 3), (128, 64, 8, 4)),
    (128, (64, 128, 8, 3), (128, 64, 8, 4)),
    (128, (64, 64, 4, 4), (128, 64, 4, 4)),
    (128, (64, 64, 8, 5), (128, 64, 8, 5)),
    (64, (128, 64, 4, 4), (128, 128, 4, 3)),
]

def make_block() -> torch.nn.Module:
    cfg = transformers.Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=INTER, num_experts=E, num_experts_per_tok=K,
                                      norm_topk_prob=True)
    torch.manual_seed(0)
    with torch.device("cuda"):
        block = qm.Qwen3MoeSparseMoeBlock(cfg).to(torch.bfloat16)
    with torch.no_grad():
        block.gate.weight.normal_(0, 0.1)
        block.experts.gate_up_proj.normal_(0, H**-0.5)
        block.experts.down_proj.normal_(0, INTER**-0.5)
    return block


def run_block(block, x, impl: str | None):
    block.experts.config._experts_implementation = impl
    return block(x[None])[0]


def run_experts(block, x, ids, weights, impl: str | None):
    block.experts.config._experts_implementation = impl
    return block.experts(x, ids, weights)


def graphed(fn):
    """fn captured in a CUDA graph (as the engines run decode steps): replaying it launches its kernels
    without per-kernel CPU work and with shorter gaps between them."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def fp8_experts(block) -> tuple:
    """The block's experts block-quantized: (w13, w2 e4m3, their [E, N/128, K/128] scales, the same in our rows)."""
    from fp8_peers import block_quantize, rows_layout

    (w13, s13), (w2, s2) = (block_quantize(w.detach()) for w in (block.experts.gate_up_proj, block.experts.down_proj))
    return w13, w2, s13, s2, rows_layout(s13, 2 * INTER), rows_layout(s2, H)


def fp8_rows(x, weights, ids, fp8) -> dict:
    from fp8_peers import vllm_fp8_fused_moe

    w13, w2, s13, s2, s13_rows, s2_rows = fp8
    rows = {f"ours fp8{name}": lambda group=group: fp8_fused_moe(x, w13, w2, s13_rows, s2_rows, weights, ids, 128,
                                                                 group)
            for name, group in (("", 128), (" weights-only", 0))}
    rows["ours fp8, CUDA graph"] = graphed(rows["ours fp8"])
    rows["fp8 torch reference"] = lambda: reference.fp8_fused_moe(x, w13, w2, s13_rows, s2_rows, weights, ids, 128, 128)
    vllm_moe, _ = vllm_fp8_fused_moe()
    if vllm_moe is not None:
        ids32, weights32 = ids.to(torch.int32), weights.float()
        rows["vllm fp8"] = lambda: vllm_moe(x, w13, w2, s13, s2, weights32, ids32)
    return rows


def implementations(block, x, fp8=None):
    _, weights, ids = block.gate(x)  # transformers' routing: weights [T, K] bf16, ids [T, K] int64
    w13, w2 = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()

    def ours_with_router():
        _, w, i = block.gate(x)
        return fused_moe(x, w13, w2, w, i)

    return ids, {
        "ours": lambda: fused_moe(x, w13, w2, weights, ids),
        "ours, CUDA graph": graphed(lambda: fused_moe(x, w13, w2, weights, ids)),
        "torch reference": lambda: reference.fused_moe(x, w13, w2, weights, ids),
        "hf experts eager": lambda: run_experts(block, x, ids, weights, None),
        "hf experts grouped_mm": lambda: run_experts(block, x, ids, weights, "grouped_mm"),
        "ours + hf router": ours_with_router,
        "hf block eager": lambda: run_block(block, x, None),
        "hf block grouped_mm": lambda: run_block(block, x, "grouped_mm"),
    } | (fp8_rows(x, weights, ids, fp8) if fp8 else {})


def fp8_close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """fp8 outputs: Hopper's e4m3 tensor cores accumulate with fewer bits than float32 and the intermediate is
    requantized to e4m3, so a few elements land one e4m3 step away (H200, T = 256: max 5.6e-2 on outputs of 2.66);
    within 1% in relative L2 and every token's row within 10%, as tests/kernels/test_triton_fp8_moe.py bounds it."""
    diff = got - want
    rows = diff.norm(dim=-1) / want.norm(dim=-1).clamp(min=0.05 * want.norm(dim=-1).mean().item() + 1e-30)
    return diff.norm().item() <= 1e-2 * want.norm().item() and rows.max().item() <= 0.1


def check(block, say, fp8) -> bool:
    """Ours vs the reference and vs transformers' block (eager) at every token count; bf16 test tolerance."""
    ok = True
    for t in TOKENS:
        x = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
        ids, fns = implementations(block, x, fp8)
        pairs = [("ours", "torch reference"), ("ours", "hf block eager")]
        pairs += [("ours fp8", "fp8 torch reference"), ("ours fp8", "vllm fp8")] if fp8 else []
        for ours, peer in pairs:
            if peer not in fns:
                continue
            got, want = fns[ours]().float(), fns[peer]().float()
            err = (got - want).abs().max().item()
            bad = not (fp8_close(got, want) if "fp8" in ours else torch.allclose(got, want, rtol=3e-2, atol=3e-2))
            ok &= not bad
            say(f"check T={t:5d}: max|{ours} - {peer}| = {err:.3e} (|{peer}| max {want.abs().max().item():.2f})"
                + ("  MISMATCH" if bad else ""))
    return ok


# they read routing counts on the CPU
CPU_SYNCING = ("torch reference", "fp8 torch reference", "hf experts eager", "hf block eager")


def wall_times(fn, rounds: int = ROUNDS, reps: int = 3) -> list[float]:
    """Milliseconds per call, wall clock between syncs (L2 flushed before each round, not each call)."""
    fn()
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    times = []
    for _ in range(rounds):
        flush_l2(flush)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        times.extend([(time.perf_counter() - t) * 1e3 / reps] * reps)
    return times


def kernel_profile(fn, reps: int = 20) -> list[tuple[str, float]]:
    """(kernel name, mean GPU us per call) of fn's kernels, in launch order."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[ev.name] = per_kernel.get(ev.name, 0.0) + ev.device_time_total / reps
    return list(per_kernel.items())


def sweep_fns(x, w13, w2, weights, ids) -> dict:
    fns = {}
    for bm, up, down in SWEEP:
        cfg = dict(block_m=bm, up=up, down=down)
        fns[f"block_m={bm:3d} up={up} down={down}"] = lambda cfg=cfg: fused_moe(x, w13, w2, weights, ids, cfg)
    return fns


@torch.no_grad()
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--fp8", action="store_true", help="also time the experts in fp8 (see the module doc)")
    parser.add_argument("--tokens", type=int, nargs="+", default=TOKENS, help="token counts (default: all four)")
    report = Report("moe", parser)
    say = report.say
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # transformers warns that a standalone block has no experts implementation
    say(f"{report.header()}, transformers {transformers.__version__}")
    say(f"Qwen3-30B-A3B-shaped layer: hidden {H}, {E} experts, top-{K}, expert intermediate {INTER}, bf16; "
        f"median of {ROUNDS} rounds x {REPS} launches, L2 flushed before each")
    block = make_block()
    fp8 = fp8_experts(block) if args.fp8 else None
    if args.check and not check(block, say, fp8):
        say("--check failed: no timings")
        return 1
    copy_bw = copy_bandwidth()
    say(f"device copy bandwidth: {copy_bw / 1e9:.0f} GB/s (read + write of a {COPY_BYTES >> 30} GiB copy)")
    rows = []
    for t in args.tokens:
        x = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
        ids, fns = implementations(block, x, fp8)
        touched = ids.unique().numel() * 3 * H * INTER * 2
        flops = 2 * t * K * 3 * H * INTER
        # Peers that sync with the CPU every call: wall-clock time (gpu_times queues GPU sleeps ahead of launches,
        # which a device sync then waits out, growing 4x a round: > 5 minutes per token count on the H100).
        syncing = {name: fns.pop(name) for name in CPU_SYNCING if name in fns}
        timed, failed = gpu_times(fns, ROUNDS, REPS)
        timed.update({name: wall_times(fn) for name, fn in syncing.items()})
        say(f"\nT={t}: {touched / 1e6:.0f} MB of expert weights touched ({touched // (3 * H * INTER * 2)} experts), "
            f"{flops / 1e9:.1f} GFLOP, moe_config {moe_config(t, K, E, torch.bfloat16)}")
        for name, err in failed.items():
            say(f"  {name:24s} failed: {err}")
        med = {}
        for name, ts in timed.items():
            med[name], lo, hi = summary(ts, ROUNDS)
            nbytes = touched / 2 * (1 + 4 / 128) if "fp8" in name else touched  # e4m3 + our scales
            say(f"  {name:24s} {med[name] * 1e3:10.1f} us  {nbytes / (med[name] * 1e-3) / copy_bw:5.2f} of copy bw  "
                f"{flops / (med[name] * 1e-3) / 1e12:6.1f} TFLOP/s   rounds {lo * 1e3:.1f}..{hi * 1e3:.1f} us")
        if args.profile:
            kernels = kernel_profile(fns["ours"])
            say(f"  ours by kernel ({sum(us for _, us in kernels):.1f} us of GPU time): "
                + ", ".join(f"{name[:40]} {us:.1f}" for name, us in kernels))
        if args.sweep:
            w13, w2 = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()
            _, weights, _ = block.gate(x)
            st, sf = gpu_times(sweep_fns(x, w13, w2, weights, ids), 2, 10)
            say("  sweep (fastest first):")
            for name, ts in sorted(st.items(), key=lambda kv: summary(kv[1], 2)[0]):
                say(f"    {name}: {summary(ts, 2)[0] * 1e3:.1f} us")
            for name, err in sf.items():
                say(f"    {name}: {err}")
        rows.append((t, med, touched, flops))
        torch.cuda.empty_cache()
    say("\n    T   ours us   bw frac  TFLOP/s  graph us  graph bw   ours/ref  ours/hf-eager  ours/hf-grouped_mm  "
        "(ours+router)/hf-block-grouped_mm")
    for t, med, touched, flops in rows:
        o = med.get("ours", float("nan"))
        ratio = {n: o / med[n] if n in med else float("nan") for n in
                 ("torch reference", "hf experts eager", "hf experts grouped_mm")}
        blk = med.get("ours + hf router", float("nan")) / med.get("hf block grouped_mm", float("nan"))
        g = med.get("ours, CUDA graph", float("nan"))
        say(f"{t:5d} {o * 1e3:9.1f} {touched / (o * 1e-3) / copy_bw:9.2f} {flops / (o * 1e-3) / 1e12:8.1f} "
            f"{g * 1e3:9.1f} {touched / (g * 1e-3) / copy_bw:9.2f} "
            f"{ratio['torch reference']:10.3f} {ratio['hf experts eager']:14.3f} "
            f"{ratio['hf experts grouped_mm']:19.3f} {blk:20.3f}")
    say("(ratios are time ours / time peer: below 1 means ours is faster)")
    if fp8:
        say("\n    T  ours fp8 us  fp8 bw frac  ours fp8/ours bf16  ours fp8/vllm fp8  weights-only us  fp8 graph us")
        for t, med, touched, _ in rows:
            f = med.get("ours fp8", float("nan"))
            say(f"{t:5d} {f * 1e3:12.1f} {touched / 2 * (1 + 4 / 128) / (f * 1e-3) / copy_bw:12.2f} "
                f"{f / med.get('ours', float('nan')):19.3f} {f / med.get('vllm fp8', float('nan')):18.3f} "
                f"{med.get('ours fp8 weights-only', float('nan')) * 1e3:16.1f} "
                f"{med.get('ours fp8, CUDA graph', float('nan')) * 1e3:13.1f}")
    report.save(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
