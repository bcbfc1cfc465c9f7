"""The outside oracle: transformers' own model on the same saved checkpoint.

`hf_greedy` refuses a reference that carries no information. Random weights with transformers' default init
(std 0.02), tied embeddings above all, make greedy output one token repeated whatever the context: then a
parity test passes with attention, the KV cache or rope broken. So every reference is checked: each output
of 8+ tokens has at least MIN_DISTINCT distinct tokens (a batch of 20 or more may hold one flat output in
twenty: some prompts reach a fixed point by chance, and the others still carry the information), and
shuffling a prompt's context (all but its last token) changes the continuation for most prompts.
"""

from __future__ import annotations

import torch

MIN_DISTINCT = 4  # distinct tokens an output of CHECKED_LEN or more tokens must have
CHECKED_LEN = 8
SHUFFLE_TOKENS = 8  # new tokens generated for each shuffled-context prompt

_cache: dict[tuple, list[list[int]]] = {}


def hf_model(path, dtype=torch.float32, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="eager",
                                                local_files_only=True).to(device).eval()


@torch.inference_mode()
def generate(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuation of each prompt by transformers `generate` (one prompt at a time, no padding)."""
    outs = []
    for p in prompts:
        ids = torch.tensor([p], device=model.device)
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
        outs.append(gen[0, len(p):].tolist())
    return outs


def hf_greedy(path, prompts: list[list[int]], max_new_tokens: int, dtype=torch.float32,
              device: str = "cpu") -> list[list[int]]:
    """transformers' greedy tokens for `prompts` on the checkpoint at `path`, after checking they are informative
    (cached per arguments: parity tests and the canary share them)."""
    key = (str(path), tuple(map(tuple, prompts)), max_new_tokens, dtype, device)
    if key not in _cache:
        _cache[key] = informative_greedy(hf_model(path, dtype, device), prompts, max_new_tokens, path)
    return [list(o) for o in _cache[key]]


def informative_greedy(model, prompts: list[list[int]], max_new_tokens: int, name) -> list[list[int]]:
    """`generate`, then `require_informative` on the outputs (`name` says whose they are in the error)."""
    outs = generate(model, prompts, max_new_tokens)
    shuffled = generate(model, [shuffle_context(p) for p in prompts], min(SHUFFLE_TOKENS, max_new_tokens))
    require_informative(name, prompts, max_new_tokens, outs, shuffled)
    return outs


def shuffle_context(prompt: list[int], seed: int = 0) -> list[int]:
    """The prompt with every token but the last in another order (a prompt of 3+ tokens always changes)."""
    head = prompt[:-1]
    if len(head) < 2:
        return list(prompt)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(head), generator=g).tolist()
    if perm == sorted(perm):
        perm = perm[1:] + perm[:1]
    return [head[i] for i in perm] + prompt[-1:]


def require_informative(path, prompts: list[list[int]], max_new_tokens: int, outs: list[list[int]],
                        shuffled: list[list[int]]) -> None:
    """Raise when the reference could not tell a working model from a broken one (see the module doc)."""
    flat = [i for i, o in enumerate(outs) if len(o) >= CHECKED_LEN and len(set(o)) < MIN_DISTINCT]
    with_context = [i for i, p in enumerate(prompts) if len(p) >= 3]
    changed = [i for i in with_context if shuffled[i] != outs[i][:SHUFFLE_TOKENS]]
    problems = []
    if len(flat) > len(outs) // 20:
        problems.append(f"outputs {flat} have fewer than {MIN_DISTINCT} distinct tokens: "
                        f"{[outs[i][:12] for i in flat]}")
    if 2 * len(changed) < len(with_context):
        problems.append(f"shuffling the context changed only {len(changed)} of {len(with_context)} continuations")
    if max_new_tokens > 1 and all(len(o) <= 1 for o in outs):
        problems.append("every output ends after its first token (EOS at once)")
    if problems:
        raise AssertionError(
            f"degenerate transformers reference for {path}: " + "; ".join(problems) + ". A parity test on it "
            "cannot catch broken attention, KV cache or rope: widen the checkpoint's init (initializer_range "
            "0.1-0.2), untie embeddings, or pick another seed/prompts.")


def random_prompts(lengths: list[int], vocab: int = 320, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
