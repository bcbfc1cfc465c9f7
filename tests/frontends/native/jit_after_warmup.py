"""Run in a fresh process by test_gpu_warmup.py: a native engine on the GPU (its start-up warms the attention
kernels), then batches that meet every attention shape class serving meets (prompts of many lengths, chunked
prefills next to decodes, prefix-cache hits over cached prefixes of any length, long decodes), under a watch
of Triton's compilations. Prints {"compiles": n, "seconds": s, "kernels": [names]} as its last line.

    python -m tests.frontends.native.jit_after_warmup CHECKPOINT [--no-warmup] [--decode-graphs-only]
(--no-warmup: the engine skips its warm-up: the canary that the watch sees what warm-up prevents;
--decode-graphs-only: steps with prompt tokens run eagerly, as without mixed_cuda_graphs: with every step a CUDA graph,
capture itself compiles each variant and serving can compile nothing, so the canary needs eager steps)
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    import atom_frontends.native.model_runner as model_runner
    from atom_frontends.native import LLM, SamplingParams
    from atom_kernels.triton.jit_watch import JitWatch
    from tests.frontends.native.hf_oracle import random_prompts

    path = sys.argv[1]
    if "--no-warmup" in sys.argv:
        model_runner.warm_up = lambda *args, **kwargs: 0
    llm = LLM(path, dtype="bfloat16", max_model_len=1024, max_num_batched_tokens=96, max_num_seqs=8,
              num_kv_blocks=512, enable_prefix_caching=True, mixed_cuda_graphs="--decode-graphs-only" not in sys.argv)
    # Everything below compiles only what no warm-up covered; the graphs' decode variants were made at capture.
    base = random_prompts([300], seed=3)[0]
    shared = [base[:n] + tail for n, tail in zip((16, 40, 77, 150, 290), random_prompts([5, 33, 2, 60, 9], seed=4))]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    with JitWatch() as jit:
        llm.generate(random_prompts([3, 17, 64, 130, 9, 250], seed=5), params, use_tqdm=False)
        llm.generate(shared, params, use_tqdm=False)  # prefix-cache hits: short queries over long prefixes
        llm.generate([base + base[:200]], SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True),
                     use_tqdm=False)  # context past 1000 tokens: more decode splits
    print(json.dumps({"compiles": jit.count, "seconds": jit.seconds, "kernels": jit.kernels}))


if __name__ == "__main__":
    main()
