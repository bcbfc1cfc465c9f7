"""The outside oracle: transformers' own model on the same saved checkpoint."""

from __future__ import annotations

import torch


def hf_greedy(path, prompts: list[list[int]], max_new_tokens: int, dtype=torch.float32) -> list[list[int]]:
    """Greedy continuation of each prompt by transformers `generate` (one prompt at a time, no padding)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True).eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=0)
            outs.append(gen[0, len(p):].tolist())
    return outs


def random_prompts(lengths: list[int], vocab: int = 320, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
