"""Tiny HF checkpoints with seeded random weights: the CLI's demo model and the tests' fixtures.

They are real checkpoints: a transformers config, the weights of the transformers model built
from it (safetensors) and, optionally, a byte-level `tokenizers` tokenizer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from atom_kernels import envs

DEMO_NOTE = "atom-core DEMO checkpoint: random weights, byte-level tokenizer; its text is meaningless"

# initializer_range 0.2, not transformers' 0.02: with 0.02 a tiny model's greedy output is one token repeated
# whatever the context, so parity tests built on these checkpoints could not catch broken attention or rope.
_BASE: dict[str, dict[str, Any]] = {
    "Qwen3ForCausalLM": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                             tie_word_embeddings=True, initializer_range=0.2),
    # 8 experts, top-2, renormalised; layer 0 dense (its MLP is intermediate_size wide), layer 1 MoE
    "Qwen3MoeForCausalLM": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                                num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0],
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                max_position_embeddings=512, tie_word_embeddings=False, initializer_range=0.2),
    # MLA: num_key_value_heads = heads (DeepSeek configs default to 128); V2: no q-LoRA, softmax greedy router
    # (norm_topk_prob off: transformers' V2 router never renormalises); layer 0 dense, layer 1 MoE (+1 shared)
    "DeepseekV2ForCausalLM": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
                                  num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                                  topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None,
                                  kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                  max_position_embeddings=512, tie_word_embeddings=False, initializer_range=0.2),
    # V3: q-LoRA, sigmoid + noaux_tc (named: V3 configs carry neither), 2 groups, yarn with mscale !=
    # mscale_all_dim (both the rotary magnitude and the softmax-scale correction matter)
    "DeepseekV3ForCausalLM": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
                                  num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                                  topk_method="noaux_tc", scoring_func="sigmoid", n_group=2, topk_group=1,
                                  norm_topk_prob=True, routed_scaling_factor=2.5, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=24,
                                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                  rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                   "original_max_position_embeddings": 128, "mscale": 1.0,
                                                   "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1},
                                  max_position_embeddings=512, tie_word_embeddings=False, initializer_range=0.2),
    "LlamaForCausalLM": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
                             initializer_range=0.2),
}
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>")  # ids 0, 1, 2; bytes follow
# A small ChatML-like template: the rendered text starts with <|bos|>, so it is tokenized without adding it.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def byte_level_tokenizer():
    """A tokenizer over the 256 bytes (no merges) that prepends <|bos|>, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    # sorted: alphabet() comes out of a hash set, in another order in every process, and with it the
    # token id of every byte (prompts built from text, and so the tests, changed from run to run)
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", 1)])
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", bos_token="<|bos|>",
                                   eos_token="<|eos|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_checkpoint(path: str | os.PathLike, arch: str = "Qwen3ForCausalLM", seed: int = 0,
                     tokenizer: bool = True, dtype: str = "float32", weights: bool = True, **overrides: Any) -> Path:
    """Save a random-weight `arch` checkpoint to `path` (weights in `dtype`, a torch dtype's name) and return it.
    weights=False: config.json (and the tokenizer) only, for load_format "dummy" at shapes too big to write."""
    import torch
    import transformers

    if arch not in _BASE:
        raise ValueError(f"no tiny config for {arch!r}; known: {', '.join(_BASE)}")
    fields = dict(_BASE[arch], vocab_size=320, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    fields.update(overrides)
    if int(transformers.__version__.split(".")[0]) < 5 and "rope_parameters" in fields:
        # transformers 4.x has no rope_parameters (it would keep it as an unused attribute): its
        # equivalent is rope_theta + rope_scaling.
        rope = dict(fields.pop("rope_parameters"))
        if "rope_theta" in rope:
            fields["rope_theta"] = rope.pop("rope_theta")
        if rope.get("rope_type", "default") != "default":
            fields["rope_scaling"] = rope
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    config = config_cls(**fields)
    path = Path(path)
    if not weights:
        config.dtype = getattr(torch, dtype)  # what dtype "auto" resolves to
        config.architectures = [arch]  # saving the model would write it: hosts pick their model class by it
        config.save_pretrained(path)
        if tokenizer:
            byte_level_tokenizer().save_pretrained(path)
        return path
    torch.manual_seed(seed)
    torch_dtype, default = getattr(torch, dtype), torch.get_default_dtype()
    # built in that dtype from the start: a multi-billion-parameter benchmark checkpoint in bfloat16 then needs half
    # the memory and init time of a float32 one converted afterwards
    torch.set_default_dtype(torch_dtype)
    try:
        model = getattr(transformers, arch)(config).to(torch_dtype)
    finally:
        torch.set_default_dtype(default)
    _randomize_correction_bias(model, seed)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer:
        byte_level_tokenizer().save_pretrained(path)
    return path


def _randomize_correction_bias(model, seed: int) -> None:
    """noaux_tc's e_score_correction_bias starts at zeros in transformers: give it the scale of the sigmoid
    scores, so a router that ignores it picks other experts."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)


def demo_checkpoint() -> Path:
    """The CLI's built-in demo model, built once and cached under $ATOM_CACHE_DIR (~/.cache/atom-core)."""
    root = envs.ATOM_CACHE_DIR
    path = root / "demo-qwen3-random-v2"  # v2: initializer_range 0.2
    if not (path / "config.json").is_file():
        tmp = path.with_suffix(".tmp")
        build_checkpoint(tmp, "Qwen3ForCausalLM", seed=1234, num_hidden_layers=4, hidden_size=128,
                         intermediate_size=384, head_dim=32, max_position_embeddings=2048)
        (tmp / "DEMO_README.txt").write_text(DEMO_NOTE + "\n")
        tmp.replace(path)
    return path
