"""vLLM on CPU: atom-core's models (our plugin) vs vLLM's own models, same checkpoint, same batch.

Each side runs in its own process (vLLM's plugins and platform are process-wide; ATOM_DISABLE_VLLM_PLUGIN=1
gives vLLM's own implementation), with vLLM's default compilation settings, in-process engine. Greedy,
float32, EOS ignored so both produce batch * new_tokens tokens; the tokens must agree. Prints output
tokens/s of both and the ratio (atom-core / vLLM) last.

    python benchmarks/vllm_plugin_cpu.py [--batch 8] [--prompt-len 64] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHECKPOINT = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=32, max_position_embeddings=1024,
                  tie_word_embeddings=False)


def worker(path: str, batch: int, prompt_len: int, new_tokens: int) -> dict:
    """One side, in this process: build the engine, warm up, time one generate of the whole batch."""
    import torch
    from vllm import LLM, SamplingParams

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, CHECKPOINT["vocab_size"], (batch, prompt_len), generator=g).tolist()
    t0 = time.perf_counter()
    llm = LLM(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=prompt_len + new_tokens + 8,
              max_num_seqs=batch, enable_prefix_caching=False, seed=0)
    startup = time.perf_counter() - t0
    greedy = dict(temperature=0.0, ignore_eos=True, detokenize=False)
    warm = [{"prompt_token_ids": p[:8]} for p in prompts]
    llm.generate(warm, SamplingParams(max_tokens=4, **greedy), use_tqdm=False)
    t = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=new_tokens, **greedy), use_tqdm=False)
    elapsed = time.perf_counter() - t
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    assert all(len(t) == new_tokens for t in tokens)
    model = llm.apply_model(lambda m: f"{type(m).__module__}.{type(m).__qualname__}")[0]
    return {"tok_s": batch * new_tokens / elapsed, "startup_s": startup, "model": model, "tokens": tokens}


def run_side(path: str, args: argparse.Namespace, disable_plugin: bool) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env["ATOM_DISABLE_VLLM_PLUGIN"] = "1" if disable_plugin else "0"
    cmd = [sys.executable, __file__, "--worker", path, "--batch", str(args.batch),
           "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{'vLLM own' if disable_plugin else 'atom-core'} side failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--worker", metavar="CHECKPOINT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch, args.prompt_len, args.new_tokens)))
        return
    from atom_frontends.native.demo import build_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_checkpoint(tmp, "Qwen3ForCausalLM", tokenizer=False, **CHECKPOINT))
        own = run_side(path, args, disable_plugin=True)
        ours = run_side(path, args, disable_plugin=False)
    same = sum(a == b for a, b in zip(ours["tokens"], own["tokens"]))
    print(f"checkpoint: Qwen3-shaped random (hidden 256, 6 layers, vocab 4096), float32, CPU x{os.cpu_count()}")
    print(f"batch {args.batch}, prompt {args.prompt_len}, new tokens {args.new_tokens}, greedy; "
          f"sequences with identical tokens: {same}/{args.batch}")
    print(f"{'model in vLLM':<18}{'output tok/s':>14}{'startup s':>12}  class")
    print(f"{'vLLM own':<18}{own['tok_s']:>14.1f}{own['startup_s']:>12.1f}  {own['model']}")
    print(f"{'atom-core plugin':<18}{ours['tok_s']:>14.1f}{ours['startup_s']:>12.1f}  {ours['model']}")
    print(f"ratio atom-core/vLLM: {ours['tok_s'] / own['tok_s']:.2f}")


if __name__ == "__main__":
    main()
