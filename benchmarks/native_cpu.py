"""Native engine vs HF transformers `generate` on CPU: same random-weight checkpoint, same batch.

Prints output tokens/s of both and the ratio (ours / HF) last. Greedy, float32, EOS ignored so
both produce exactly batch * new_tokens tokens.

    python benchmarks/native_cpu.py [--batch 8] [--prompt-len 64] [--new-tokens 64]

The engine runs with overlap scheduling as ATOM_OVERLAP_SCHEDULING says (default off on CPU, where the
device and the host are the same cores: nothing to overlap; =1 runs the same bookkeeping, for a comparison).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from common import SMALL_QWEN3, add_batch_args, random_prompts, ratio_line, small_checkpoint


def bench_hf(path, prompts, new_tokens):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)  # equal lengths: no padding needed
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                  min_new_tokens=new_tokens, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids[:, :8], **dict(kwargs, max_new_tokens=2, min_new_tokens=2))  # warm-up
        t = time.perf_counter()
        out = model.generate(ids, **kwargs)
        elapsed = time.perf_counter() - t
    assert out.shape[1] - ids.shape[1] == new_tokens
    return len(prompts) * new_tokens / elapsed


def bench_native(path, prompts, new_tokens):
    from atom_frontends.native import LLM, SamplingParams

    llm = LLM(path, dtype="float32", max_num_seqs=len(prompts))
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate([p[:8] for p in prompts], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t
    assert all(len(o.outputs[0].token_ids) == new_tokens for o in outs)
    return len(prompts) * new_tokens / elapsed, llm.engine.overlap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_batch_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    with tempfile.TemporaryDirectory() as tmp:
        path = small_checkpoint(tmp)
        prompts = random_prompts(args.batch, args.prompt_len, SMALL_QWEN3["vocab_size"])
        hf = bench_hf(path, prompts, args.new_tokens)
        ours, overlap = bench_native(path, prompts, args.new_tokens)
    threads = torch.get_num_threads()
    print(f"checkpoint: Qwen3-shaped random (hidden 256, 6 layers, vocab 4096), float32, CPU x{threads}")
    print(f"batch {args.batch}, prompt {args.prompt_len}, new tokens {args.new_tokens}, greedy; "
          f"native overlap scheduling {'on' if overlap else 'off'}")
    print(f"{'engine':<22}{'output tok/s':>14}")
    print(f"{'transformers generate':<22}{hf:>14.1f}")
    print(f"{'atom-core native':<22}{ours:>14.1f}")
    print(ratio_line("native/HF", ours, hf))


if __name__ == "__main__":
    main()
