"""SGLang on a CUDA GPU: atom-core's model + `atom` attention backend vs SGLang's own model and its default
attention backend, same checkpoint, same workloads as benchmarks/vllm_plugin_gpu.py.

A random checkpoint (--shape), bf16, SGLang's defaults (CUDA graphs, radix cache, chunked prefill, the
overlap scheduler). Each side runs in its own process (SGLang's model registry is process-wide, and a failing
engine kills its parent's process tree):
  atom    SGLANG_EXTERNAL_MODEL_PACKAGE=atom_frontends.sglang.models, --attention-backend atom
  sglang  SGLang's own Qwen3, its default attention backend on this GPU
Rows: batch 1 and batch 32 (128-token random prompts, 128 new tokens, greedy, EOS ignored; tokens/s = new tokens /
time of the whole generate, prefill included) and offline (256 requests, prompt and output lengths uniform in
[100, 1024], temperature 1, EOS ignored; output tokens/s of the whole run). Each row runs once untimed, then
timed --repeats times; the median counts. Prints both sides, how many batch-32 greedy sequences agree (bf16:
near-ties may differ) and the ratio atom-core / SGLang's own last; writes the table to benchmarks/results/.
For the GPU machine with the carried SGLang (tools/gpu_sglang). --profile DIR then runs each decode row once more
under SGLang's profiler on both sides and prints, per side, the decode graph's GPU time per replay next to the host's
period between replays, the top kernels and the host functions (benchmarks/gpu_profile.py).

--shape picks the checkpoint: qwen3-0.6b (default), qwen3-30b-a3b-4l (Qwen3-30B-A3B's MoE cut to 4 layers, all 128
experts) or deepseek-v3-4l (DeepSeek-V3's MLA + MoE cut to 4 layers, the first dense, 64 of 256 experts; ~23 GB,
written in bf16).

    python benchmarks/sglang_plugin_gpu.py [--shape NAME] [--checkpoint DIR] [--rows batch1,batch32,offline]
                                           [--repeats N] [--profile DIR]
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
from pathlib import Path

from common import MAX_MODEL_LEN, Report, greedy_agreement, row_lines, shaped_checkpoint
from vllm_plugin_gpu import NEW, ROWS, workloads

EXTERNAL = "atom_frontends.sglang.models"
# --shape → (common.SHAPES key, config changes, checkpoint dtype)
CHECKPOINTS = {
    "qwen3-0.6b": ("qwen3-0.6b", {}, "float32"),
    "qwen3-30b-a3b-4l": ("qwen3-30b-a3b-4l", {}, "bfloat16"),
    "deepseek-v3-4l": ("deepseek-v3", dict(num_hidden_layers=4, first_k_dense_replace=1, n_routed_experts=64),
                       "bfloat16"),
}


def sampling_params(lens: list[int], temperature: float) -> list[dict]:
    """One request's SGLang sampling params per output length (EOS ignored: every request makes its tokens)."""
    return [dict(temperature=temperature, max_new_tokens=m, ignore_eos=True) for m in lens]


def time_row(engine, prompts: list[list[int]], lens: list[int], temperature: float, repeats: int) -> dict:
    """{"tok_s": median output tokens/s, "runs": each timed run's, "tokens": the last run's, "first_s"}."""
    params = sampling_params(lens, temperature)
    t = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params)
    first_s = time.perf_counter() - t
    rates = []
    for _ in range(repeats):
        engine.flush_cache()  # every timed run prefills its prompts, as the first one did
        t = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        elapsed = time.perf_counter() - t
        produced = sum(len(o["output_ids"]) for o in outs)
        assert produced == sum(lens), f"{produced} tokens, expected {sum(lens)}"
        rates.append(produced / elapsed)
    return {"tok_s": statistics.median(rates), "runs": rates, "tokens": [o["output_ids"] for o in outs],
            "first_s": first_s}


def profile_rows(engine, loads: dict, rows: list[str], out_dir: Path, side: str) -> list[str]:
    """Each decode row once more under SGLang's own profiler (in its scheduler process: CPU, GPU and the Python
    stack), summarized by gpu_profile.trace_lines: where each side's decode step goes."""
    from gpu_profile import trace_lines

    lines = []
    for row in (r for r in rows if r != "offline"):
        prompts, lens, temperature = loads[row]
        engine.flush_cache()
        target = out_dir / f"{side}-{row}"
        engine.start_profile(output_dir=str(target), activities=["CPU", "GPU"], with_stack=True, record_shapes=False)
        engine.generate(input_ids=prompts, sampling_params=sampling_params(lens, temperature))
        engine.stop_profile()
        traces = sorted(target.glob("*.trace.json*"))
        if not traces:
            raise SystemExit(f"SGLang wrote no trace into {target}")
        lines += trace_lines(str(traces[-1]), f"{side} {row}")
    return lines


def worker(path: str, side: str, rows: list[str], repeats: int, profile: str | None = None) -> dict:
    """One side, in this process: one engine for all rows."""
    import sglang

    vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
    backend = {"attention_backend": "atom"} if side == "atom" else {}
    t0 = time.perf_counter()
    engine = sglang.Engine(model_path=path, dtype="bfloat16", skip_tokenizer_init=True, context_length=MAX_MODEL_LEN,
                           random_seed=0, log_level="warning", **backend)
    result = {"startup_s": time.perf_counter() - t0}
    try:
        info = engine.get_server_info()
        result["attention_backend"] = info.get("attention_backend")
        result["cuda_graph"] = not info.get("disable_cuda_graph", False)
        loads = workloads(vocab)
        for row in rows:
            timed = time_row(engine, *loads[row], repeats)
            result[f"{row}_first_s"] = timed.pop("first_s")
            result[row] = timed
        if profile:
            result["profile"] = profile_rows(engine, loads, rows, Path(profile), side)
    finally:
        engine.shutdown()
    return result


def run_side(path: str, side: str, rows: list[str], repeats: int, profile: str | None) -> dict:
    env = dict(os.environ)
    env.pop("SGLANG_EXTERNAL_MODEL_PACKAGE", None)
    if side == "atom":
        env["SGLANG_EXTERNAL_MODEL_PACKAGE"] = EXTERNAL
    cmd = [sys.executable, __file__, "--worker", side, "--checkpoint", path, "--rows", ",".join(rows),
           "--repeats", str(repeats)] + (["--profile", profile] if profile else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{side} side failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(CHECKPOINTS), default="qwen3-0.6b")
    ap.add_argument("--checkpoint", help="checkpoint dir (built once into the temp dir when absent)")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each row per side (the median counts)")
    ap.add_argument("--profile", metavar="DIR", help="then profile the decode rows once more on each side (SGLang's "
                    "profiler; traces kept in DIR) and print where each side's decode step goes")
    ap.add_argument("--worker", choices=("atom", "sglang"), help=argparse.SUPPRESS)
    report = Report("sglang_plugin_gpu", ap)
    args = ap.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    if unknown := set(rows) - set(ROWS):
        raise SystemExit(f"unknown rows {sorted(unknown)}; choose from {ROWS}")
    if args.worker:
        print(json.dumps(worker(args.checkpoint, args.worker, rows, args.repeats, args.profile)))
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("sglang_plugin_gpu.py needs a CUDA GPU (benchmarks/sglang_plugin_cpu.py is the CPU one)")
    shape, overrides, dtype = CHECKPOINTS[args.shape]
    if args.shape != "qwen3-0.6b":  # its own results file
        report.stem += f"-{args.shape}"
    path = shaped_checkpoint(args.checkpoint, shape, dtype, **overrides)
    own = run_side(path, "sglang", rows, args.repeats, args.profile)
    ours = run_side(path, "atom", rows, args.repeats, args.profile)
    lines = [f"{datetime.date.today()} {torch.cuda.get_device_name()}; {args.shape}-shaped random checkpoint, bf16, "
             f"SGLang defaults; attention backend: own {own['attention_backend']}, atom-core "
             f"{ours['attention_backend']}; CUDA graphs: own {own['cuda_graph']}, atom-core {ours['cuda_graph']}",
             f"startup s: own {own['startup_s']:.0f}, atom-core {ours['startup_s']:.0f}"]
    if "batch32" in rows:
        lines.append(greedy_agreement(own["batch32"]["tokens"], ours["batch32"]["tokens"], "SGLang", NEW))
    lines += own.get("profile", []) + ours.get("profile", [])
    lines += row_lines(own, ours, rows, "SGLang")
    for line in lines:
        report.say(line)
    report.save(args.out)


if __name__ == "__main__":
    main()
