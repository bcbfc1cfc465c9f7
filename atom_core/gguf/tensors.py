"""GGUF tensors → HF checkpoint tensors: names mapped, weights dequantized, llama.cpp's q/k row order undone."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import torch

from atom_core.gguf.reader import GGUFFile, gguf_module

# llama.cpp's per-block tensor names → transformers' (the `blk.N.` prefix becomes `model.layers.N.`)
_BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_NAME = re.compile(r"^(?:blk\.(?P<layer>\d+)\.)?(?P<base>[a-z_]+)\.(?P<kind>weight|bias)$")
# Types stored unquantized: copied, not dequantized.
_PLAIN = ("F32", "F16", "BF16", "F64")


def check_tensor_types(f: GGUFFile) -> dict[str, int]:
    """Count of tensors per type; raise naming the tensors whose type the `gguf` package cannot dequantize."""
    gguf = gguf_module()
    counts: dict[str, int] = {}
    bad = []
    for name, t in f.tensors.items():
        kind = t.tensor_type.name
        counts[kind] = counts.get(kind, 0) + 1
        if kind not in _PLAIN and t.tensor_type not in gguf.quants._type_traits:
            bad.append(f"{name} ({kind})")
    if bad:
        raise ValueError(f"{f.path}: tensor type(s) the gguf package {gguf_version()} cannot dequantize: "
                         f"{', '.join(bad[:6])}{' …' if len(bad) > 6 else ''}; upgrade gguf or use another "
                         "quantization of this model")
    return counts


def gguf_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("gguf")


def dequantized(f: GGUFFile, name: str) -> torch.Tensor:
    """Tensor `name` as float32, shaped as PyTorch stores it ([out, in] for a linear weight)."""
    t = f.tensors[name]
    kind = t.tensor_type.name
    array = t.data if kind in _PLAIN else gguf_module().quants.dequantize(t.data, t.tensor_type)
    # GGUF lists dimensions innermost first; numpy/torch outermost first. np.array copies (the map is read-only).
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    return torch.from_numpy(np.array(array, dtype=np.float32).reshape(shape))


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's convert_hf_to_gguf `permute` of Llama q/k rows: per head it stores the rotary pairs
    interleaved (x0, x_half, x1, x_half+1, ...) for GGML's rope; HF keeps the two halves apart.
    w: [n_heads * head_dim, ...] → same shape."""
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def hf_tensors(f: GGUFFile, permute_qk: tuple[int, int] | None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, float32 tensor) for every tensor of `f`. permute_qk: (query heads, kv heads) for Llama-family
    GGUFs, whose q/k rows llama.cpp permuted; None for those it did not (Qwen3)."""
    for name in f.tensors:
        m = _NAME.match(name)
        base = m and m["base"]
        if m is None or base not in (_TOP if m["layer"] is None else _BLOCK):
            hint = " (llama3 rope scaling as a frequency tensor)" if name == "rope_freqs.weight" else ""
            raise ValueError(f"{f.path}: tensor {name!r}{hint} has no counterpart in atom-core's "
                             f"{f.architecture} model; this GGUF cannot be converted")
        w = dequantized(f, name)
        if m["layer"] is None:
            yield f"{_TOP[base]}.{m['kind']}", w
            continue
        prefix = f"model.layers.{m['layer']}"
        if permute_qk is not None and base in ("attn_q", "attn_k"):
            w = unpermute_rows(w, permute_qk[0] if base == "attn_q" else permute_qk[1])
        yield f"{prefix}.{_BLOCK[base]}.{m['kind']}", w
