"""Small GGUF files written with the `gguf` package's own writer, as llama.cpp's convert_hf_to_gguf lays them out:
llama.cpp names, Llama q/k rows permuted for GGML's rope, mixed Q8_0 / F16 / F32 tensors, a byte-level BPE
tokenizer and a chat template in the metadata. Made from the random-weight HF checkpoints of demo.build_checkpoint
(wide init, so greedy outputs depend on the context)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

GGUF_ARCH = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}
PRE = {"llama": "llama-bpe", "qwen3": "qwen2"}
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permute of Llama q/k rows (per head, the two rotary halves interleaved)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    _, _, layer, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER[module]}.{kind}"


def write_gguf(path: Path, checkpoint: Path, config, quant: str = "Q8_0", arch: str | None = None,
               tensor_type: dict[str, object] | None = None) -> Path:
    """Write `checkpoint` (an HF dir with `config`, its transformers config) as a GGUF: 2-D weights of even layers
    in `quant`, of odd layers and the embeddings in F16, norms in F32. arch overrides general.architecture;
    tensor_type forces a GGML type for some tensors (given as raw bytes of that type)."""
    import gguf

    arch = arch or GGUF_ARCH[config.architectures[0]]
    w = gguf.GGUFWriter(str(path), arch)
    _write_metadata(w, arch, config)
    for name, t in load_file(str(checkpoint / "model.safetensors")).items():
        t = t.astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            t = permute(t, config.num_attention_heads if "q_proj" in name else config.num_key_value_heads)
        g = gguf_name(name)
        if tensor_type and g in tensor_type:
            block, size = gguf.GGML_QUANT_SIZES[tensor_type[g]]
            w.add_tensor(g, np.zeros((t.shape[0], t.shape[1] // block * size), np.uint8), raw_dtype=tensor_type[g])
        elif t.ndim == 1:
            w.add_tensor(g, t)
        elif g.startswith("blk.") and int(g.split(".")[1]) % 2 == 0:
            qtype = gguf.GGMLQuantizationType[quant]
            w.add_tensor(g, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(g, t.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _write_metadata(w, arch: str, c) -> None:
    from atom_core.layers.rotary import rope_parameters
    from atom_frontends.native.demo import CHAT_TEMPLATE, byte_level_tokenizer

    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    for key, value in (("context_length", c.max_position_embeddings), ("embedding_length", c.hidden_size),
                       ("block_count", c.num_hidden_layers), ("feed_forward_length", c.intermediate_size),
                       ("attention.head_count", c.num_attention_heads), ("vocab_size", c.vocab_size),
                       ("attention.head_count_kv", c.num_key_value_heads), ("rope.dimension_count", head_dim),
                       ("attention.key_length", head_dim), ("attention.value_length", head_dim)):
        w.add_uint32(f"{arch}.{key}", int(value))
    w.add_float32(f"{arch}.rope.freq_base", float(rope_parameters(c)["rope_theta"]))
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", float(c.rms_norm_eps))
    vocab = byte_level_tokenizer().get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    tokens += ["ĠĠ"] + [f"<|unused{i}|>" for i in range(c.vocab_size - len(tokens) - 1)]  # ĠĠ: the merge's result
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", PRE[arch] if arch in PRE else "default")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [3 if t.startswith("<|") else 1 for t in tokens])
    w.add_array("tokenizer.ggml.merges", ["Ġ Ġ"])
    for key, value in (("bos", 1), ("eos", 2), ("padding", 0)):
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", value)
    w.add_string("tokenizer.chat_template", CHAT_TEMPLATE)
