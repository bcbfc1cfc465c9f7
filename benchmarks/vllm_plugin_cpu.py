"""vLLM on CPU: atom-core's models (our plugin) vs vLLM's own models, same checkpoint, same batch.

Each side runs in its own process (vLLM's plugins and platform are process-wide; ATOM_DISABLE_VLLM_PLUGIN=1
gives vLLM's own implementation), with vLLM's default compilation settings, in-process engine. Greedy,
float32, EOS ignored so both produce batch * new_tokens tokens; the tokens must agree. With --runs N the two
sides alternate N times (a busy machine slows both alike) and the medians count. Prints every run's output
tokens/s, the medians and their ratio (atom-core / vLLM) last; also output tokens per second of the worker
process's CPU time (all its threads; median), a second view when other processes load the machine.

    python benchmarks/vllm_plugin_cpu.py [--batch 8] [--prompt-len 64] [--new-tokens 64] [--runs 3] [--generates 5]
                                         [--profile]

--profile: each side's first run also profiles one more generate (torch.profiler, in the worker: the engine runs
in-process) and prints its ops by self CPU time before the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import SMALL_QWEN3, add_batch_args, random_prompts, ratio_line, small_checkpoint


def profile_generate(llm, requests, params) -> str:
    """One generate under torch.profiler: wall time and the ops by self CPU time (the GEMMs, attention, ...)."""
    from torch.profiler import ProfilerActivity, profile

    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate(requests, params, use_tqdm=False)
    wall = time.perf_counter() - t
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:14]
    lines = [f"one profiled generate: wall {wall * 1e3:.1f} ms, self CPU time of its ops:"]
    lines += [f"  {e.self_cpu_time_total / 1e3:8.2f} ms {e.count:6d}x  {e.key[:80]}" for e in ops]
    return "\n".join(lines)


def worker(path: str, batch: int, prompt_len: int, new_tokens: int, generates: int, profile: bool = False) -> dict:
    """One side, in this process: build the engine, warm up, time `generates` generates of the whole batch
    and keep the fastest (each takes well under a second on an idle machine; load from elsewhere only adds
    time, and vLLM's OpenMP threads, bound to every core, stall whenever another process takes one)."""
    from vllm import LLM, SamplingParams

    prompts = random_prompts(batch, prompt_len, SMALL_QWEN3["vocab_size"])
    t0 = time.perf_counter()
    llm = LLM(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=prompt_len + new_tokens + 8,
              max_num_seqs=batch, enable_prefix_caching=False, seed=0)
    startup = time.perf_counter() - t0
    greedy = dict(temperature=0.0, ignore_eos=True, detokenize=False)
    warm = [{"prompt_token_ids": p[:8]} for p in prompts]
    llm.generate(warm, SamplingParams(max_tokens=4, **greedy), use_tqdm=False)
    requests = [{"prompt_token_ids": p} for p in prompts]
    params = SamplingParams(max_tokens=new_tokens, **greedy)
    times, cpu_times = [], []
    for _ in range(generates):
        t, c = time.perf_counter(), time.process_time()
        outs = llm.generate(requests, params, use_tqdm=False)
        times.append(time.perf_counter() - t)
        cpu_times.append(time.process_time() - c)
    elapsed = min(times)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    assert all(len(t) == new_tokens for t in tokens)
    model = llm.apply_model(lambda m: f"{type(m).__module__}.{type(m).__qualname__}")[0]
    result = {"tok_s": batch * new_tokens / elapsed, "tok_cpu_s": batch * new_tokens / min(cpu_times),
              "startup_s": startup, "model": model, "tokens": tokens}
    if profile:
        result["profile"] = profile_generate(llm, requests, params)
    return result


def run_side(path: str, args: argparse.Namespace, disable_plugin: bool, profile: bool = False) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env["ATOM_DISABLE_VLLM_PLUGIN"] = "1" if disable_plugin else "0"
    cmd = [sys.executable, __file__, "--worker", path, "--batch", str(args.batch),
           "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
           "--generates", str(args.generates)]
    cmd += ["--profile"] if profile else []
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{'vLLM own' if disable_plugin else 'atom-core'} side failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_batch_args(ap)
    ap.add_argument("--runs", type=int, default=3, help="runs of each side, alternating; medians count")
    ap.add_argument("--generates", type=int, default=5, help="timed generates per run; each run keeps its fastest")
    ap.add_argument("--profile", action="store_true", help="profile one more generate in each side's first run")
    ap.add_argument("--worker", metavar="CHECKPOINT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        result = worker(args.worker, args.batch, args.prompt_len, args.new_tokens, args.generates, args.profile)
        print(json.dumps(result))
        return
    own_runs, our_runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = small_checkpoint(tmp)
        for i in range(args.runs):  # alternating, so that load from elsewhere hits both sides alike
            own_runs.append(run_side(path, args, disable_plugin=True, profile=args.profile and i == 0))
            our_runs.append(run_side(path, args, disable_plugin=False, profile=args.profile and i == 0))
    reference = own_runs[0]["tokens"]  # every run of either side against vLLM's first
    same = min(sum(a == b for a, b in zip(r["tokens"], reference)) for r in own_runs[1:] + our_runs)
    own_tok_s = statistics.median(r["tok_s"] for r in own_runs)
    our_tok_s = statistics.median(r["tok_s"] for r in our_runs)
    for name, runs in (("vLLM own", own_runs), ("atom-core plugin", our_runs)):
        if "profile" in runs[0]:
            print(f"profile, {name}: {runs[0]['profile']}")
    print(f"checkpoint: Qwen3-shaped random (hidden 256, 6 layers, vocab 4096), float32, CPU x{os.cpu_count()}")
    print(f"batch {args.batch}, prompt {args.prompt_len}, new tokens {args.new_tokens}, greedy; "
          f"sequences with identical tokens (worst run): {same}/{args.batch}")
    print(f"{'model in vLLM':<18}{'output tok/s (median)':>22}  {'runs':<24}{'tok/CPU-s':>10}{'startup s':>10}  class")
    for name, runs, median in (("vLLM own", own_runs, own_tok_s), ("atom-core plugin", our_runs, our_tok_s)):
        each = ", ".join(f"{r['tok_s']:.0f}" for r in runs)
        cpu = statistics.median(r["tok_cpu_s"] for r in runs)
        print(f"{name:<18}{median:>22.1f}  {each:<24}{cpu:>10.0f}{runs[0]['startup_s']:>10.1f}  {runs[0]['model']}")
    print(ratio_line("atom-core/vLLM", our_tok_s, own_tok_s))


if __name__ == "__main__":
    main()
