"""SGLang on CPU: atom-core's model + attention backend vs SGLang's own, same checkpoint, same batch.

Sides, each in its own process (SGLang's model registry and plugins are process-wide, and a failing
SGLang engine kills its parent process tree):
  atom         atom-core's model (SGLANG_EXTERNAL_MODEL_PACKAGE) + --attention-backend atom
  atom+native  atom-core's model + SGLang's torch_native attention backend
  sglang       SGLang's own model + torch_native: the peer the ratio is taken against. Without
               SGLANG_USE_CPU_ENGINE (which needs SGLang's CPU kernel build) SGLang's RoPE models do not
               run on CPU; the script then prints why and takes the ratio against "atom+native".
Greedy, float32, EOS ignored, radix cache off; the tokens of every side that ran must agree. Prints
output tokens/s per side (fastest of --repeats timed generates) and the ratio (atom / peer) last.

    python benchmarks/sglang_plugin_cpu.py [--batch 8] [--prompt-len 64] [--new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import SMALL_QWEN3, add_batch_args, random_prompts, ratio_line, small_checkpoint

SIDES = {  # name → (use atom-core's model package, attention backend)
    "atom": (True, "atom"),
    "atom+native": (True, "torch_native"),
    "sglang": (False, "torch_native"),
}
EXTERNAL = "atom_frontends.sglang.models"
HINTS = {"sglang": "SGLang's RoPE layers need vllm's op or SGLang's CPU kernels (SGLANG_USE_CPU_ENGINE=1 "
                   "with sgl-kernel's CPU build) to run on a CPU-only machine"}


def worker(path: str, side: str, batch: int, prompt_len: int, new_tokens: int, repeats: int) -> dict:
    """One side, in this process: start the engine, warm up, time `repeats` generates of the whole
    batch and keep the fastest (the machine may be shared)."""
    import sglang

    prompts = random_prompts(batch, prompt_len, SMALL_QWEN3["vocab_size"])
    t0 = time.perf_counter()
    engine = sglang.Engine(model_path=path, device="cpu", dtype="float32", attention_backend=SIDES[side][1],
                           skip_tokenizer_init=True, disable_cuda_graph=True, disable_radix_cache=True,
                           mem_fraction_static=0.25, max_total_tokens=batch * (prompt_len + new_tokens) + 256,
                           max_running_requests=batch, log_level="error")
    startup = time.perf_counter() - t0
    greedy = dict(temperature=0.0, ignore_eos=True)
    try:
        engine.generate(input_ids=[p[:8] for p in prompts], sampling_params=dict(greedy, max_new_tokens=4))
        times, runs = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            outs = engine.generate(input_ids=prompts, sampling_params=dict(greedy, max_new_tokens=new_tokens))
            times.append(time.perf_counter() - t)
            runs.append([o["output_ids"] for o in outs])
    finally:
        engine.shutdown()
    tokens = runs[0]
    assert all(len(t) == new_tokens for t in tokens) and all(r == tokens for r in runs)
    return {"tok_s": batch * new_tokens / min(times), "startup_s": startup, "tokens": tokens}


def run_side(path: str, side: str, args: argparse.Namespace) -> tuple[dict | None, str]:
    """(result, "") or (None, why it did not run)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        env = dict(os.environ)
        env.pop("SGLANG_EXTERNAL_MODEL_PACKAGE", None)
        if SIDES[side][0]:
            env["SGLANG_EXTERNAL_MODEL_PACKAGE"] = EXTERNAL
        a = args
        sizes = [f"--batch={a.batch}", f"--prompt-len={a.prompt_len}", f"--new-tokens={a.new_tokens}",
                 f"--repeats={a.repeats}"]
        cmd = [sys.executable, __file__, "--worker", side, "--model", path, "--out", out, *sizes]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode == 0 and os.path.exists(out):
            with open(out) as f:
                return json.load(f), ""
        return None, _reason(proc.stdout + proc.stderr, proc.returncode)


def _reason(log: str, code: int) -> str:
    errors = [line.strip() for line in log.splitlines() if "Error" in line and ":" in line]
    return errors[-1][:300] if errors else f"exit code {code}; last output: {log[-300:]!r}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_batch_args(ap)
    ap.add_argument("--repeats", type=int, default=3, help="timed generates per side; the fastest counts")
    ap.add_argument("--worker", choices=list(SIDES), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        result = worker(args.model, args.worker, args.batch, args.prompt_len, args.new_tokens, args.repeats)
        with open(args.out, "w") as f:
            json.dump(result, f)
        return

    with tempfile.TemporaryDirectory() as tmp:
        path = small_checkpoint(tmp)
        print(f"batch={args.batch} prompt_len={args.prompt_len} new_tokens={args.new_tokens} "
              f"(Qwen3 {SMALL_QWEN3['num_hidden_layers']}x{SMALL_QWEN3['hidden_size']}, float32, CPU)")
        results: dict[str, dict] = {}
        for side in SIDES:
            result, why = run_side(path, side, args)
            if result is None:
                print(f"{side:12s} did not run: {why}" + (f" ({HINTS[side]})" if side in HINTS else ""))
                continue
            results[side] = result
            tok_s, start = result["tok_s"], result["startup_s"]
            print(f"{side:12s} {tok_s:8.1f} output tok/s  (engine start {start:.0f} s)")
    if "atom" not in results:
        raise SystemExit("atom-core's side did not run")
    for side, result in results.items():
        if result["tokens"] != results["atom"]["tokens"]:
            print(f"WARNING: greedy tokens of {side!r} differ from atom-core's")
    peer = "sglang" if "sglang" in results else "atom+native"
    if peer not in results:
        raise SystemExit("no peer ran in this run")
    print(ratio_line(f"atom / {peer}", results["atom"]["tok_s"], results[peer]["tok_s"], "x"))


if __name__ == "__main__":
    main()
