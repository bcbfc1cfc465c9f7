"""vLLM on a CUDA GPU: atom-core's model (our plugin) vs vLLM's own, same checkpoint, same workloads.

Qwen3-0.6B-shaped random checkpoint, bf16, vLLM's defaults (torch.compile, CUDA graphs). Each side runs
in its own process (plugins and the platform are process-wide; ATOM_DISABLE_VLLM_PLUGIN=1 gives vLLM's
own model), in-process engine, one engine per side for all rows:
  - batch 1 and batch 32: 128-token random prompts, 128 new tokens, greedy, EOS ignored; tokens/s =
    new tokens / time of the whole generate (prefill included);
  - offline: 256 requests, prompt and output lengths uniform in [100, 1024] (seeded), temperature 1,
    EOS ignored; output tokens/s of the whole run.
Each row runs once untimed, then timed --repeats times (default 3; the median counts; the first run's time is
printed too, and the Triton compilations inside the timed runs).
Prints both sides, how many batch-32 greedy sequences agree (bf16: near-ties may differ), and the
ratio atom-core / vLLM's own last; writes the table to benchmarks/results/.
--quant fp8: the same shape as an FP8 block-quantized checkpoint (common.FP8_BLOCK), config.json alone: each side
draws random weights at load (vLLM's load format "dummy"), so the two sides' weights differ and greedy tokens are
not compared; --quant fp8-channel: the same in compressed-tensors' per-channel format (common.FP8_CHANNEL; vLLM's
own model then runs its CUTLASS scaled_mm).

    python benchmarks/vllm_plugin_gpu.py [--checkpoint DIR] [--rows batch1,batch32,offline] [--repeats N] [--profile]
                                         [--quant fp8|fp8-channel]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from common import MAX_MODEL_LEN, QUANT_CONFIGS, Report, greedy_agreement, offline_lengths, row_lines, shaped_checkpoint

ROWS = ("batch1", "batch32", "offline")
PROMPT, NEW = 128, 128


def workloads(vocab: int) -> dict[str, tuple[list[list[int]], list[int], float]]:
    """row → (prompts, max_tokens per prompt, temperature)."""
    rng, offline_lens = offline_lengths()  # then the rows' prompts, in this order, from the same generator

    def prompt(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    return {
        "batch1": ([prompt(PROMPT)], [NEW], 0.0),
        "batch32": ([prompt(PROMPT) for _ in range(32)], [NEW] * 32, 0.0),
        "offline": ([prompt(p) for p, _ in offline_lens], [o for _, o in offline_lens], 1.0),
    }


def requests_and_params(vocab: int, row: str, max_tokens: int | None = None) -> tuple[list[dict], list]:
    """A row's vLLM requests and per-request SamplingParams (seeded; max_tokens overrides the row's lengths)."""
    from vllm import SamplingParams

    prompts, lens, temperature = workloads(vocab)[row]
    params = [SamplingParams(max_tokens=max_tokens or m, temperature=temperature, ignore_eos=True,
                             detokenize=False, seed=i) for i, m in enumerate(lens)]
    return [{"prompt_token_ids": p} for p in prompts], params


def profile_rows(llm, vocab: int, rows: list[str]) -> str:
    """Each row's workload under the profiler, in this process (the engine runs in-process): gpu_profile's
    kernels by kind, top kernels, wall vs GPU time. batch1: the whole row (its 128-token prefill and 127 decode
    steps); batch1 and batch32: a 9-token generate (1 prefill + 8 decode steps); offline: the whole row."""
    import torch
    from gpu_profile import profile_call

    parts = []
    if "batch1" in rows:
        parts.append(profile_call(partial(llm.generate, *requests_and_params(vocab, "batch1"), use_tqdm=False),
                                  f"{NEW}-token batch1 generate", top=6, host_top=12))
    for row in ("batch1", "batch32"):
        if row not in rows:
            continue
        requests, params = requests_and_params(vocab, row, max_tokens=9)
        llm.generate(requests, params, use_tqdm=False)  # same shapes once, outside the profile
        torch.cuda.synchronize()
        parts.append(profile_call(partial(llm.generate, requests, params, use_tqdm=False), f"9-token {row} generate"))
    if "offline" in rows:  # the timed runs above already ran it: no first-use work left inside
        parts.append(profile_call(partial(llm.generate, *requests_and_params(vocab, "offline"), use_tqdm=False),
                                  "offline row", top=14, host_top=8))
    return "\n".join(parts)


def model_class(model) -> str:
    """Which model class a vLLM worker runs. For llm.apply_model, which pickles it into vLLM's engine and worker
    processes when they are others: by reference, so not a lambda, nor defined in a script run as __main__."""
    return f"{type(model).__module__}.{type(model).__qualname__}"


def time_requests(llm, requests: list[dict], params: list, repeats: int) -> dict:
    """Output tokens/s of one llm.generate of these requests: run once untimed, then timed `repeats` times.
    {"tok_s": the median, "runs": each run's, "tokens": the last run's tokens, "first_s": the untimed run's
    seconds, "jit": the Triton compilations inside the timed runs (this process's: none are seen from here when
    the model runs in vLLM's worker processes)}."""
    from atom_kernels.triton.jit_watch import JitWatch

    expected = sum(p.max_tokens for p in params)
    # Once untimed first: kernels JIT-compiled on first use (our Triton attention picks its tiles by query length)
    # and allocator growth stay out of the timed runs, for both sides alike.
    t = time.perf_counter()
    llm.generate(requests, params, use_tqdm=False)
    first_s = time.perf_counter() - t
    rates = []
    with JitWatch() as jit:  # Triton compilations inside the timed runs (a variant first met there)
        for _ in range(repeats):
            t = time.perf_counter()
            outs = llm.generate(requests, params, use_tqdm=False)
            elapsed = time.perf_counter() - t
            produced = sum(len(o.outputs[0].token_ids) for o in outs)
            assert produced == expected, f"{produced} tokens, expected {expected}"
            rates.append(produced / elapsed)
    return {"tok_s": statistics.median(rates), "runs": rates, "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "first_s": first_s, "jit": str(jit)}


def worker(path: str, rows: list[str], profile: bool = False, repeats: int = 1) -> dict:
    """One side, in this process: one engine, a warm-up, then each row timed `repeats` times (the median counts)."""
    from vllm import LLM

    vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
    t0 = time.perf_counter()
    dummy = not any(Path(path).glob("*.safetensors"))  # a config.json alone (--quant fp8): weights drawn at load
    llm = LLM(model=path, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN, seed=0,
              load_format="dummy" if dummy else "auto")
    result = {"startup_s": time.perf_counter() - t0}
    for row in rows:
        timed = time_requests(llm, *requests_and_params(vocab, row), repeats)
        result[f"{row}_first_s"], result[f"{row}_jit"] = timed.pop("first_s"), timed.pop("jit")
        result[row] = timed
    if profile:
        result["profile"] = profile_rows(llm, vocab, rows)
    result["model"] = llm.apply_model(model_class)[0]
    result["cudagraph_mode"] = str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode)
    return result


def run_side(path: str, rows: list[str], own: bool, profile: bool, repeats: int = 1) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "ATOM_DISABLE_VLLM_PLUGIN": "1" if own else "0"}
    cmd = [sys.executable, __file__, "--worker", path, "--rows", ",".join(rows), "--repeats", str(repeats)]
    cmd += ["--profile"] if profile else []
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    name = "vLLM own" if own else "atom-core"
    if proc.returncode != 0:
        raise SystemExit(f"{name} side failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}")
    for line in proc.stderr.splitlines():  # what vLLM decided about compilation and graphs for our model
        if ("atom-core" in line or "cudagraph" in line.lower() or "CUDA graph" in line) and "it/s" not in line:
            print(f"  [{name}] {line[-200:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="checkpoint dir (built once into the temp dir when absent)")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--profile", action="store_true", help="also profile each row's workload on each side")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each row per side (the median counts)")
    ap.add_argument("--only-ours", action="store_true", help="only atom-core's side, profiled; no table")
    ap.add_argument("--quant", choices=sorted(QUANT_CONFIGS), help="an FP8 checkpoint of the shape, dummy weights")
    ap.add_argument("--worker", metavar="CHECKPOINT", help=argparse.SUPPRESS)
    report = Report("vllm_plugin_gpu", ap)
    args = ap.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    if unknown := set(rows) - set(ROWS):
        raise SystemExit(f"unknown rows {sorted(unknown)}; choose from {ROWS}")
    if args.worker:
        print(json.dumps(worker(args.worker, rows, args.profile, args.repeats)))
        return
    import torch

    if args.quant:
        path = shaped_checkpoint(args.checkpoint, weights=False, quantization_config=QUANT_CONFIGS[args.quant])
    else:
        path = shaped_checkpoint(args.checkpoint)
    if args.only_ours:  # a profile of our side alone
        print(run_side(path, rows, own=False, profile=True).get("profile"))
        return
    own = run_side(path, rows, own=True, profile=args.profile, repeats=args.repeats)
    ours = run_side(path, rows, own=False, profile=args.profile, repeats=args.repeats)
    for name, side in (("vLLM own", own), ("atom-core", ours)):
        if "profile" in side:
            print(f"profile, {name}: {side['profile']}")
    kind = f"{args.quant} checkpoint, weights drawn at load" if args.quant else "random checkpoint, bf16"
    lines = [f"{datetime.date.today()} {torch.cuda.get_device_name()}; Qwen3-0.6B-shaped {kind}, "
             f"vLLM defaults; cudagraph mode: own {own['cudagraph_mode']}, atom-core {ours['cudagraph_mode']}",
             f"models: {own['model']} | {ours['model']}; startup s: own {own['startup_s']:.0f}, "
             f"atom-core {ours['startup_s']:.0f}"]
    if "batch32" in rows and not args.quant:
        lines.append(greedy_agreement(own["batch32"]["tokens"], ours["batch32"]["tokens"], "vLLM", NEW))
    lines.append("Triton compilations inside the timed runs: " + ", ".join(
        f"{row} own {own[f'{row}_jit']} / atom-core {ours[f'{row}_jit']}" for row in rows))
    lines += row_lines(own, ours, rows, "vLLM")
    for line in lines:
        report.say(line)
    report.save(args.out)


if __name__ == "__main__":
    main()
