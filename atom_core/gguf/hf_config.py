"""A transformers config.json (as a dict) from a GGUF's metadata, for the architectures atom-core runs."""

from __future__ import annotations

from typing import Any

from atom_core.gguf.reader import GGUFFile

# GGUF general.architecture → (HF architecture, model_type, llama.cpp permuted q/k rows). MoE (qwen3moe) and MLA
# (deepseek2) GGUFs are not converted yet: refused, naming these.
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama", True),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", False),
}


def hf_architecture(f: GGUFFile) -> tuple[str, str, bool]:
    if f.architecture not in ARCHITECTURES:
        raise ValueError(f"{f.path}: GGUF architecture {f.architecture!r} is not supported; atom-core reads GGUFs "
                         f"of: {', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[f.architecture]


def hf_config(f: GGUFFile) -> dict[str, Any]:
    """config.json fields. Rope is written as rope_theta (+ rope_scaling), which transformers 4.x and 5 both read."""
    arch, model_type, _ = hf_architecture(f)
    hidden = int(f.require("{arch}.embedding_length"))
    heads = int(f.require("{arch}.attention.head_count"))
    head_dim = int(f.get("{arch}.attention.key_length", hidden // heads))
    rope_dim = int(f.get("{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"{f.path}: rotary over {rope_dim} of {head_dim} head dimensions (partial rotary) is not "
                         f"supported for {f.architecture}")
    tokens = f.get("tokenizer.ggml.tokens")
    vocab = f.get("{arch}.vocab_size") or (len(tokens) if tokens else int(f.tensors["token_embd.weight"].shape[1]))
    cfg: dict[str, Any] = {
        "architectures": [arch], "model_type": model_type, "torch_dtype": "float32",
        "vocab_size": int(vocab), "hidden_size": hidden,
        "intermediate_size": int(f.require("{arch}.feed_forward_length")),
        "num_hidden_layers": int(f.require("{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(f.get("{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(f.get("{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(f.get("{arch}.context_length", 2048)),
        "rope_theta": float(f.get("{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in f.tensors,
        "attention_bias": "blk.0.attn_q.bias" in f.tensors,
        "hidden_act": "silu",
    }
    scaling = _rope_scaling(f)
    if scaling:
        cfg["rope_scaling"] = scaling
    for key in ("bos", "eos", "padding"):
        value = f.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            cfg["pad_token_id" if key == "padding" else f"{key}_token_id"] = int(value)
    return cfg


def _rope_scaling(f: GGUFFile) -> dict[str, Any] | None:
    kind = f.get("{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    factor = float(f.require("{arch}.rope.scaling.factor"))
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        return {"rope_type": "yarn", "factor": factor,
                "original_max_position_embeddings": int(f.require("{arch}.rope.scaling.original_context_length"))}
    raise ValueError(f"{f.path}: rope scaling {kind!r} is not supported (linear and yarn are)")
