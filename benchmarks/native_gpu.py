"""Native engine vs HF transformers `generate` on one GPU: Qwen3-0.6B-shaped random checkpoint, bf16.

Default: prompt 128 + 128 new tokens (greedy, EOS ignored) at batch 1 and 32, HF `generate` eager and with a
static KV cache (which makes it compile the decode forward with torch.compile, CUDA graphs). Decode tokens/s =
batch * 127 / (time for 128 tokens - time for 1 token), for both engines (the native engine with a token budget
of 8192, so the prompts are prefilled in one step as HF does); the roofline is the bytes
one decode step must read (all weights once + the K/V of every context token, at the mean context
128 + 64) over the device copy bandwidth measured here. Also checks that the first 16 greedy tokens
match HF's and, where they do not, prints the fp32 logit margin of the two candidates.

The native engine runs three times: as configured by default (overlap scheduling on), with overlap
scheduling off (EngineArgs.overlap_scheduling=False: the step before), and with ATOM_FUSED_QK_NORM_ROPE=0 (the
q/k norm, rotary and KV write as separate ops instead of the fused prologue, the default).
"host ms" is a step's wall time minus the time the host waited for the device (CUDA event waits): with
overlap it runs while the device computes, so a step costs max(host, device) instead of their sum.

--throughput: 256 requests, prompt and output lengths uniform in [100, 1024], temperature 1,
EOS ignored (the common offline workload); output tokens/s over the whole run, and the decode
roofline of the same work (ATOM_FUSED_QK_NORM_ROPE=0 in the environment: the unfused ops);
with overlap scheduling on and then off in the same run (--overlap on|off: one of them only).
When vLLM is installed, vLLM's own model runs the same workload in the same way (vllm_peer.py) and the ratio
native / vLLM's own is printed last.
--kv-cache-dtype fp8: the engine's KV cache in fp8 e4m3 (scale 1.0: half the KV bytes each decode step reads);
the roofline then counts those bytes.

--shape qwen3-30b-a3b-4l: a Qwen3-30B-A3B-shaped MoE checkpoint cut to 4 layers (hidden 2048, 128 experts,
top-8, expert intermediate 768; ~2.5 B parameters) instead; its roofline counts the expected number of distinct
experts a decode step touches (E * (1 - (1 - k/E)^batch) per MoE layer), not all of them.

--quant fp8: the same shape as bf16 and as an FP8 block-quantized checkpoint, both with random weights drawn at load
(native_fp8.py): decode tok/s at batch 1 and 32, the FP8 / bf16 ratio last; with --profile, the profile below of each.
--shape qwen3-8b: a dense shape whose batch-1 decode step is a weight read (16 GB of bf16), for --quant fp8.

--profile: only a profile of the default engine (gpu_profile.py: GPU kernels by kind, top kernels, wall vs GPU);
with --throughput, of the offline workload.

    python benchmarks/native_gpu.py [--throughput | --profile] [--overlap both|on|off] [--kv-cache-dtype auto|fp8]
                                    [--checkpoint DIR] [--shape NAME] [--quant fp8]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import time
from functools import partial

import torch
import vllm_peer
from common import (
    MAX_MODEL_LEN,
    QWEN3_06B,
    SHAPES,
    copy_bandwidth,
    offline_prompts,
    random_prompts,
    shaped_checkpoint,
)

from atom_kernels import envs
from atom_kernels.triton.jit_watch import JitWatch

PROMPT, NEW, PARITY_TOKENS = 128, 128, 16
# The offline engine's token budget a step: vLLM's offline default on an H100 (its peer runs with it). Session 12
# A/B on one H100, alternating: 16,384 gave 19,740 / 19,346 output tok/s vs 18,048 / 18,754 with 8,192 (the
# prompts prefilled in ~10 steps instead of 19: fewer eager steps, all requests decoding sooner).
OFFLINE_TOKENS_PER_STEP = 16384
OFFLINE_GOAL = 20000  # output tok/s, bf16 KV cache (the native-speed issue's goal)
CONFIGS = (("native", True, True), ("native, no overlap", True, False),  # (name, fused prologue, overlap)
           ("native, unfused qk-norm-rope", False, True))
DEVICE = "cuda"


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


class GraphTimer:
    """GPU time of the decode-graph replays (CUDA events around each), to split a step's wall time into
    the decode graphs on the GPU (forward, logits, sample_tokens) and everything else (host work, sampling the
    graph does not do, eager steps)."""

    def __init__(self, llm) -> None:
        self.events: list = []
        graphs = llm.engine.runner.graphs
        if graphs is not None:
            replay = graphs.replay

            def timed_replay(size):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                out = replay(size)
                b.record()
                self.events.append((size, a, b))
                return out

            graphs.replay = timed_replay

    def seconds(self) -> float:
        torch.cuda.synchronize()
        return sum(a.elapsed_time(b) for _, a, b in self.events) / 1e3

    def by_size(self, sizes=(256, 128, 64, 32, 8, 1)) -> str:
        """Mean GPU ms of one replay at a few padded batch sizes."""
        parts = []
        for size in sizes:
            ms = [a.elapsed_time(b) for s, a, b in self.events if s == size]
            if ms:
                parts.append(f"{size}: {sum(ms) / len(ms):.2f} ms x{len(ms)}")
        return ", ".join(parts)


class HostTimer:
    """Engine steps and the seconds the host spent waiting for the device in them (CUDA event waits: the reads
    of sampled tokens, the input builder's wait for its last copy), inside a with-block."""

    def __init__(self, llm) -> None:
        self.engine, self.steps, self.waited = llm.engine, 0, 0.0

    def __enter__(self):
        self._sync, self._step = torch.cuda.Event.synchronize, self.engine.step
        sync, step = self._sync, self._step

        def timed_sync(event):
            t = time.perf_counter()
            sync(event)
            self.waited += time.perf_counter() - t

        def counted_step():
            self.steps += 1
            return step()

        torch.cuda.Event.synchronize, self.engine.step = timed_sync, counted_step
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.Event.synchronize = self._sync
        del self.engine.step  # back to the class's method

    def host_ms(self, wall: float) -> float:
        """Mean host milliseconds per step: wall time not spent waiting for the device."""
        return (wall - self.waited) * 1e3 / max(self.steps, 1)


def hf_decode(model, prompts) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts, device=DEVICE)  # equal lengths: no padding

    def gen(n):
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                              min_new_tokens=n, pad_token_id=0)

    gen(4)  # warm-up
    _, t1 = timed(lambda: gen(1))
    out, tn = timed(lambda: gen(NEW))
    return len(prompts) * (NEW - 1) / (tn - t1), out[:, PROMPT:].tolist()


def hf_decode_static(model, prompts) -> float:
    """hf_decode with a static KV cache: on a GPU, generate then compiles the decode forward (torch.compile, mode
    reduce-overhead: CUDA graphs), transformers' fastest documented path. Warmed with the longest run first, so the
    timed calls reuse its cache size (no recompilation). Decode tok/s, same timing as hf_decode."""
    ids = torch.tensor(prompts, device=DEVICE)

    def gen(n):
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                              min_new_tokens=n, pad_token_id=0, cache_implementation="static")

    for _ in range(3):  # compilation, then CUDA-graph recording
        gen(NEW)
    _, t1 = timed(lambda: gen(1))
    _, tn = timed(lambda: gen(NEW))
    return len(prompts) * (NEW - 1) / (tn - t1)


def native_decode(llm, prompts) -> tuple[float, float, float, list[list[int]]]:
    """(decode tok/s, decode-graph GPU ms per decode step, host ms per step, tokens)."""
    from atom_frontends.native import SamplingParams

    def gen(n, ps=prompts):
        return llm.generate(ps, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)

    gen(4, [p[::-1] for p in prompts])  # warm-up: JIT-compiles the prefill kernels
    with JitWatch() as jit:
        _, t1 = timed(lambda: gen(1))
        timer = GraphTimer(llm)
        with HostTimer(llm) as host:
            outs, tn = timed(lambda: gen(NEW))
    if jit.count:
        print(f"  note: Triton compiled {jit} inside the timed batch-{len(prompts)} decode")
    graph_ms = timer.seconds() * 1e3 / max(len(timer.events), 1)
    return (len(prompts) * (NEW - 1) / (tn - t1), graph_ms, host.host_ms(tn),
            [o.outputs[0].token_ids for o in outs])


def native_engine(path: str, fused: bool, overlap: bool = True, **kw):
    """The engine with Qwen3's fused q/k norm + rotary + KV write on or off (fused_qk_norm_rope) and overlap
    scheduling on or off."""
    from atom_frontends.native import LLM

    llm = LLM(path, dtype="bfloat16", max_model_len=MAX_MODEL_LEN, overlap_scheduling=overlap,
              fused_qk_norm_rope=fused, **kw)
    assert llm.engine.overlap == overlap
    return llm


def free_gpu() -> None:
    """Give back the memory of engines no longer referenced (weights, KV cache, graph pools)."""
    gc.collect()
    torch.cuda.empty_cache()


@torch.inference_mode()
def margins(model32, prompts, ref, got) -> list[str]:
    """For each prompt whose first PARITY_TOKENS differ: the fp32 logits gap of the two candidates."""
    lines = []
    for i, (p, r, g) in enumerate(zip(prompts, ref, got)):
        r, g = r[:PARITY_TOKENS], g[:PARITY_TOKENS]
        if r == g:
            continue
        k = next(j for j, (a, b) in enumerate(zip(r, g)) if a != b)
        logits = model32(torch.tensor([p + r[:k]], device=DEVICE)).logits[0, -1].float()
        top2 = logits.topk(2).values
        # fp32 rank of each candidate (1 = the fp32 argmax): tells a near-tie from one side being wrong
        rank_hf, rank_ours = ((logits > logits[c]).sum().item() + 1 for c in (r[k], g[k]))
        lines.append(f"  prompt {i}: diverges at token {k} (HF {r[k]}, ours {g[k]}): fp32 logit margin "
                     f"{(logits[r[k]] - logits[g[k]]).abs().item():.4f}, fp32 ranks HF {rank_hf} ours {rank_ours} "
                     f"(fp32 top-2 gap {(top2[0] - top2[1]).item():.4f}, logit std {logits.std().item():.3f})")
    return lines


def latency(path: str, configs) -> None:
    from transformers import AutoModelForCausalLM

    bw = copy_bandwidth()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, local_files_only=True).to(DEVICE).eval()
    cfg = hf.config
    weight_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())  # tied: counted once
    expert_bytes = sum(p.numel() * p.element_size() for n, p in hf.named_parameters() if ".experts." in n)
    num_experts, top_k = getattr(cfg, "num_experts", 0), getattr(cfg, "num_experts_per_tok", 0)

    def bytes_read(batch: int) -> float:
        """Weights one decode step reads: all dense weights, and the experts `batch` tokens are expected to touch."""
        if not expert_bytes:
            return weight_bytes
        touched = 1 - (1 - top_k / num_experts) ** batch
        return weight_bytes - expert_bytes * (1 - touched)
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; weights {weight_bytes / 1e9:.3f} GB; KV {kv_per_token} B/token")
    batches = {b: random_prompts(b, PROMPT, cfg.vocab_size, seed=b) for b in (1, 32)}
    hf_runs = {b: hf_decode(hf, ps) for b, ps in batches.items()}
    hf_static = {}
    for b, ps in batches.items():
        try:
            hf_static[b] = hf_decode_static(hf, ps)
        except Exception as e:  # noqa: BLE001 - where transformers' compiled path does not run: reported, not fatal
            hf_static[b] = f"failed ({type(e).__name__}: {str(e)[:120]})"
    rows, parity = [], []
    for name, fused, overlap in configs:
        # a token budget that prefills the batch-32 prompts in one step, as HF does (and vLLM's offline default,
        # 8192): with the native default of 2048 its decode-timed span also held eager prefill chunks of other
        # sequences, and steps where half the batch had one token more to go
        llm = native_engine(path, fused, overlap, max_num_seqs=32, kv_cache_memory=8 << 30,
                            enable_prefix_caching=False, max_num_batched_tokens=8192)
        assert llm.engine.runner.graphs is not None, "CUDA graphs are off"
        for b, prompts in batches.items():
            tps, graph_ms, host_ms, tokens = native_decode(llm, prompts)
            roof = b * bw / (bytes_read(b) + b * (PROMPT + NEW / 2) * kv_per_token)
            rows.append((b, name, tps, b / tps * 1e3, graph_ms, host_ms, tps / roof, tps / hf_runs[b][0]))
            parity.append((f"{name}, batch {b}", prompts, hf_runs[b][1], tokens))
        del llm
        free_gpu()
    hf.float()  # the fp32 oracle for margins
    for what, prompts, ref, got in parity:
        same = sum(r[:PARITY_TOKENS] == g[:PARITY_TOKENS] for r, g in zip(ref, got))
        print(f"bf16 parity, {what}: first {PARITY_TOKENS} greedy tokens match HF for {same}/{len(ref)} prompts")
        for line in margins(hf, prompts, ref, got):
            print(line)
    print(f"\n{'batch':>5}  {'engine':<27} {'tok/s':>9} {'ms/step':>8} {'graph GPU ms':>13} {'host ms':>8} "
          f"{'of roofline':>12} {'vs HF':>7}")
    for b, (hf_tps, _) in hf_runs.items():
        print(f"{b:>5}  {'HF generate':<27} {hf_tps:>9.1f} {b / hf_tps * 1e3:>8.2f}")
        static = hf_static[b]
        print(f"{b:>5}  {'HF static cache + compile':<27} " + (f"{static:>9.1f} {b / static * 1e3:>8.2f}"
                                                                 if isinstance(static, float) else static))
        for row in rows:
            if row[0] == b:
                print(f"{b:>5}  {row[1]:<27} {row[2]:>9.1f} {row[3]:>8.2f} {row[4]:>13.2f} {row[5]:>8.2f} "
                      f"{row[6]:>12.1%} {row[7]:>7.1f}")
    tps = {(r[0], r[1]): r[2] for r in rows}
    vs_static = {b: tps[b, "native"] / hf_static[b] for b in batches
                 if (b, "native") in tps and isinstance(hf_static[b], float)}
    if vs_static:
        print("native / HF static cache + compile: " + ", ".join(f"batch {b} x{r:.1f}" for b, r in vs_static.items()))
    if all((b, name) in tps for b in batches for name in ("native", "native, no overlap")):
        print("overlap scheduling: " + ", ".join(f"batch {b} x{tps[b, 'native'] / tps[b, 'native, no overlap']:.2f}"
                                                  for b in batches) + " (native / native, no overlap)")
    print("(roofline: weights + KV at mean context 192 read once per decode step at the copy bandwidth; "
          "graph GPU ms: the decode graph (forward, logits, sample_tokens), the rest of a step is host work; "
          "host ms: a step's wall time minus its waits for the device)")


def offline_workload():
    """The 256 requests (common.offline_prompts): (prompts, sampling params, (prompt, output) lengths)."""
    from atom_frontends.native import SamplingParams

    prompts, lens = offline_prompts(QWEN3_06B["vocab_size"])
    params = [SamplingParams(temperature=1.0, top_p=1.0, max_tokens=o, ignore_eos=True) for _, o in lens]
    return prompts, params, lens


def throughput(path: str, overlaps: tuple[bool, ...], kv_cache_dtype: str) -> None:
    prompts, params, lens = offline_workload()
    bw = copy_bandwidth()
    rates = {}
    for overlap in overlaps:
        rates[overlap] = throughput_run(path, overlap, prompts, params, lens, bw, kv_cache_dtype)
        free_gpu()
    if len(rates) == 2:
        print(f"\noverlap scheduling: output tok/s {rates[True]:.0f} on vs {rates[False]:.0f} off: "
              f"x{rates[True] / rates[False]:.2f}")
    if vllm_peer.available():  # vLLM's own model on the same workload, same timing (vllm_peer.py)
        peer = vllm_peer.offline_tok_s(path, kv_cache_dtype)
        ours = rates[overlaps[0]]
        print(f"\nvLLM's own Qwen3, same workload and KV cache dtype: {peer:.0f} output tok/s")
        print(f"native / vLLM's own: {ours:.0f} / {peer:.0f} = {ours / peer:.2f}")


def throughput_run(path: str, overlap: bool, prompts, params, lens, bw: float, kv_cache_dtype: str) -> float:
    """One timed run of the offline workload; prints its lines, returns output tokens/s."""

    fused = envs.ATOM_FUSED_QK_NORM_ROPE is not False
    llm = offline_engine(path, fused, overlap, kv_cache_dtype, prompts)
    timer = GraphTimer(llm)
    with JitWatch() as jit, HostTimer(llm) as host:
        outs, t = timed(lambda: llm.generate(prompts, params, use_tqdm=False))
    n_in, n_out = sum(p for p, _ in lens), sum(len(o.outputs[0].token_ids) for o in outs)
    assert n_out == sum(o for _, o in lens)
    graph_s = timer.seconds()
    # Roofline: every decode step reads the weights once and the K/V of each running sequence's context.
    runner = llm.engine.runner
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.engine.model.parameters())
    kv_reads = sum(o * p + o * (o - 1) // 2 for p, o in lens)  # context tokens over all decode steps
    roof_s = (kv_reads * runner.bytes_per_block() / llm.engine.config.block_size
              + len(timer.events) * weight_bytes) / bw
    print(f"\noverlap scheduling {'on' if overlap else 'off'}: 256 requests, {n_in} prompt + {n_out} output tokens "
          f"in {t:.2f} s ({OFFLINE_TOKENS_PER_STEP} tokens a step); preemptions "
          f"{llm.engine.scheduler.num_preemptions}; fused qk-norm-rope {fused}; "
          f"KV cache {runner.kv_dtype}")
    print(f"decode graphs: {len(timer.events)} replays, {graph_s:.2f} s on the GPU ({graph_s / t:.0%} of the run); "
          f"the rest is eager prefill steps, sampling the graph does not do and host work")
    print(f"decode graph GPU time per replay by padded batch size: {timer.by_size()}")
    print(f"{host.steps} steps: host {host.host_ms(t):.2f} ms/step, wall {t * 1e3 / max(host.steps, 1):.2f} ms/step "
          f"(the host waited for the device {host.waited / t:.0%} of the run)")
    print(f"Triton JIT compilations inside the timed run: {jit}")
    print(f"{'metric':<22} {'native':>10} {'goal':>8} {'native/goal':>12}")
    print(f"{'output tok/s':<22} {n_out / t:>10.0f} {OFFLINE_GOAL:>8} {n_out / t / OFFLINE_GOAL:>12.2f}")
    print(f"{'total tok/s':<22} {(n_in + n_out) / t:>10.0f}")
    print(f"{'decode roofline tok/s':<22} {n_out / roof_s:>10.0f}   (copy bandwidth {bw / 1e12:.2f} TB/s; "
          f"native reaches {roof_s / t:.0%})")
    return n_out / t


def offline_engine(path: str, fused: bool, overlap: bool, kv_cache_dtype: str, prompts):
    """The engine of the offline workload, warmed up: the same prompts reversed (no prefix-cache hits later), 2
    tokens each, so the eager steps mixing prefills with decodes JIT-compile their Triton variants here rather
    than in the timed run."""
    from atom_frontends.native import SamplingParams

    llm = native_engine(path, fused, overlap, max_num_seqs=256, max_num_batched_tokens=OFFLINE_TOKENS_PER_STEP,
                        kv_cache_dtype=kv_cache_dtype)
    warm = [p[::-1] for p in prompts]
    llm.generate(warm, SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    return llm


def throughput_profile(path: str, kv_cache_dtype: str) -> None:
    """The offline workload once under the profiler (overlap on): GPU kernels by kind, the top kernels and host
    ops; wall minus GPU kernel time is when the GPU idled."""
    from gpu_profile import profile_call

    prompts, params, _ = offline_workload()
    llm = offline_engine(path, True, True, kv_cache_dtype, prompts)
    print(profile_call(partial(llm.generate, prompts, params, use_tqdm=False),
                       f"offline workload (KV {kv_cache_dtype})", top=25, host_top=20))


def profile(path: str, label: str = "", **kw) -> None:
    """The default engine at batch 1 and 32: a 33-token generate (1 prefill + 32 decode steps, graphs) under the
    profiler, after the same generate once untimed: GPU kernels by kind, the top kernels, wall vs GPU time. kw: more
    engine arguments (native_fp8.py: load_format "dummy")."""
    from gpu_profile import profile_call

    from atom_frontends.native import SamplingParams

    llm = native_engine(path, fused=envs.ATOM_FUSED_QK_NORM_ROPE is not False, max_num_seqs=32,
                        kv_cache_memory=8 << 30, enable_prefix_caching=False, **kw)
    vocab = QWEN3_06B["vocab_size"]  # every Qwen3 shape shares it
    params = SamplingParams(temperature=0, max_tokens=33, ignore_eos=True)
    for b in (1, 32):
        prompts = random_prompts(b, PROMPT, vocab, seed=b)
        llm.generate(prompts, params, use_tqdm=False)
        print(profile_call(partial(llm.generate, prompts, params, use_tqdm=False),
                           f"{label}33-token batch-{b} generate"))
    del llm
    free_gpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--throughput", action="store_true", help="the 256-request offline workload")
    ap.add_argument("--checkpoint", help="where the random checkpoint is (built there if missing)")
    ap.add_argument("--profile", action="store_true", help="only profile a 33-token generate at batch 1 and 32")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    ap.add_argument("--overlap", choices=["both", "on", "off"], default="both",
                    help="overlap scheduling of the native engine: both (a before/after in one run), on or off")
    ap.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto", help="--throughput's KV cache")
    ap.add_argument("--quant", choices=["fp8"], help="decode of an FP8 block-quantized checkpoint vs bf16 (alone; "
                    "with --profile: the profile of each)")
    ap.add_argument("--prefetch-ab", action="store_true", help="--quant fp8: each FP8 checkpoint also with the GEMV's "
                    "L2 prefetch off (ATOM_PDL_PREFETCH=0), on / off ratios last")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.quant:
        import native_fp8

        print(f"{datetime.date.today()} {torch.cuda.get_device_name()} torch {torch.__version__}")
        if args.profile:
            return native_fp8.profiles(args.shape)
        return native_fp8.fp8_vs_bf16(args.shape, args.prefetch_ab)
    path = shaped_checkpoint(args.checkpoint, args.shape)
    print(f"{datetime.date.today()} {torch.cuda.get_device_name()} torch {torch.__version__}; "
          f"{args.shape}-shaped random checkpoint, bf16")
    overlaps = {"both": (True, False), "on": (True,), "off": (False,)}[args.overlap]
    if args.profile and args.throughput:
        throughput_profile(path, args.kv_cache_dtype)
    elif args.profile:
        profile(path)
    elif args.throughput:
        throughput(path, overlaps, args.kv_cache_dtype)
    else:
        latency(path, [c for c in CONFIGS if c[2] in overlaps])


if __name__ == "__main__":
    main()
