"""vLLM's own model on native_gpu.py's offline workload: the peer of `native_gpu.py --throughput`.

Same checkpoint, the same 256 prompts and lengths, temperature 1, top_p 1, EOS ignored, max_model_len 2048, the
same KV cache dtype, vLLM's default engine limits otherwise (as a vLLM user runs it: on the H100 its offline
default of 1,024 sequences is larger than the 256 the native engine runs with; both take 16,384 tokens a step),
and the same timing: a warm-up on the reversed prompts (2 tokens each, so no prefix-cache hit later), then one
timed generate of the whole workload; output tokens / its wall time. vLLM runs in a child process with its
in-process engine and its own Qwen3 (ATOM_DISABLE_VLLM_PLUGIN=1), compiled with CUDA graphs as its defaults do.

    python benchmarks/vllm_peer.py CHECKPOINT [auto|fp8]      (what native_gpu.py --throughput runs when vLLM is there)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time


def available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def offline_tok_s(path: str, kv_cache_dtype: str) -> float:
    """Output tokens/s of vLLM's own model on the workload (a child process)."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "ATOM_DISABLE_VLLM_PLUGIN": "1"}
    proc = subprocess.run([sys.executable, __file__, path, kv_cache_dtype], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"vLLM peer failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}")
    print(next((line for line in proc.stderr.splitlines() if line.startswith("vLLM limits")), ""))
    return json.loads(proc.stdout.strip().splitlines()[-1])["tok_s"]


def worker(path: str, kv_cache_dtype: str) -> dict:
    from common import MAX_MODEL_LEN, QWEN3_06B, offline_prompts
    from vllm import LLM, SamplingParams

    prompts, lens = offline_prompts(QWEN3_06B["vocab_size"])
    llm = LLM(model=path, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN, seed=0,
              kv_cache_dtype=kv_cache_dtype)
    sched = llm.llm_engine.vllm_config.scheduler_config
    print(f"vLLM limits: max_num_seqs {sched.max_num_seqs}, max_num_batched_tokens {sched.max_num_batched_tokens}",
          file=sys.stderr)
    warm = SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": p[::-1]} for p in prompts], warm, use_tqdm=False)
    params = [SamplingParams(temperature=1.0, top_p=1.0, max_tokens=o, ignore_eos=True, detokenize=False)
              for _, o in lens]
    t = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - t
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    assert produced == sum(o for _, o in lens), f"{produced} output tokens, expected {sum(o for _, o in lens)}"
    return {"tok_s": produced / elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="the checkpoint native_gpu.py built")
    ap.add_argument("kv_cache_dtype", nargs="?", choices=["auto", "fp8"], default="auto")
    args = ap.parse_args()
    print(json.dumps(worker(args.checkpoint, args.kv_cache_dtype)))


if __name__ == "__main__":
    main()
