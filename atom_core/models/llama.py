"""Llama-family decoder (Llama, and Qwen3 with per-head q/k RMSNorm). Shapes: hidden [T, hidden_size]."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable

import torch
from torch import nn

import atom_kernels
from atom_core.config import AtomConfig
from atom_core.layers import (
    Attention,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_gated_act,
    get_rope,
)
from atom_core.layers.attention import FULL_ATTENTION_OPS
from atom_core.models.weights import load_named_weights

logger = logging.getLogger(__name__)


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _sliding_window(cfg, layer_idx: int) -> int | None:
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and layer_types[layer_idx] == "sliding_attention":
        return getattr(cfg, "sliding_window", None)
    return None


def _fused_qk_norm_rope(wanted: bool | None, attn) -> bool:
    """Run Qwen3's q/k norm + rotary fused with the K/V write (AtomConfig.fused_qk_norm_rope: None = where the
    layer supports it)? A host's attention layer supports it with `fuses_qk_norm_rope` (and offers
    `forward_qk_norm_rope`, which may answer None for a step it cannot fuse: the unfused form runs for that step);
    otherwise the unfused q/k norm + rotary + the layer's own cache write run, and the log says so once when the
    fused form was asked for explicitly (True)."""
    if wanted is False:
        return False
    if getattr(attn, "fuses_qk_norm_rope", False):
        return True
    if wanted:
        _warn_fused_unsupported(type(attn).__qualname__)
    return False


@functools.cache
def _warn_fused_unsupported(layer_class: str) -> None:
    logger.warning("atom-core: fused_qk_norm_rope (ATOM_FUSED_QK_NORM_ROPE=1) is not supported by the %s "
                   "attention layer yet; "
                   "running the unfused q/k norm + rotary (same results)", layer_class)


class LlamaAttention(nn.Module):
    kernel_ops = FULL_ATTENTION_OPS  # (the fused Qwen3 prologue, when on, replaces the KV write)

    @staticmethod
    def rope_dim(cfg) -> int:
        """The width the model's one rotary table covers (a head; MLA: its rope part)."""
        return _head_dim(cfg)

    def __init__(self, config: AtomConfig, layer_idx: int, prefix: str, qk_norm: bool,
                 rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        cfg = config.hf_config
        self.head_dim = _head_dim(cfg)
        num_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        bias = getattr(cfg, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, self.head_dim, cfg.num_attention_heads, num_kv, bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * self.head_dim, cfg.hidden_size, bias)
        self.rotary_emb = rotary_emb  # the model's one table, shared by every layer
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads,
                              sliding_window=_sliding_window(cfg, layer_idx),
                              kv_cache_dtype=config.kv_cache_dtype, prefix=f"{prefix}.attn")
        self.fused_qk_norm_rope = qk_norm and _fused_qk_norm_rope(config.fused_qk_norm_rope, self.attn)

    fuses_input_norm = True  # see normed_sublayer

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None = None,
                norm: nn.Module | None = None):
        """hidden [T, hidden_size] → [T, hidden_size]; with the layer's input norm: hidden not normed yet, and
        returns (out, hidden + residual) (see normed_sublayer)."""
        if norm is None:
            return self._attend(positions, self.qkv_proj(hidden))
        qkv, residual = self.qkv_proj.forward_normed(hidden, residual, norm)
        return self._attend(positions, qkv), residual

    def _attend(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        t = qkv.shape[0]
        q, k, v = qkv.split(self.qkv_proj.sizes, dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        if self.fused_qk_norm_rope:  # the layer runs the norms and rotary in its K/V write
            norm_rope = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, self.rotary_emb.cos_sin_cache)
            out = self.attn.forward_qk_norm_rope(positions, q, k, v.view(t, self.num_kv_heads, self.head_dim),
                                                 norm_rope)
            if out is not None:  # (None: not this step, e.g. SGLang's prefills)
                return self.o_proj(out)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        # explicit widths: a batch may have no tokens (SGLang's IDLE steps under DP attention)
        out = self.attn(q.reshape(t, self.num_heads * self.head_dim), k.reshape(t, self.num_kv_heads * self.head_dim),
                        v.contiguous())
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    """Gated MLP (SiLU); `intermediate_size` defaults to the config's (MoE models pass their shared experts' size)."""

    fuses_input_norm = True  # see normed_sublayer

    def __init__(self, cfg, intermediate_size: int | None = None) -> None:
        super().__init__()
        check_gated_act(cfg.hidden_act)
        bias = getattr(cfg, "mlp_bias", False)
        inter = intermediate_size or cfg.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [inter] * 2, bias)
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, bias)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, norm: nn.Module | None = None):
        """x [T, hidden_size] → [T, hidden_size]; with the layer's norm: x not normed yet, and returns
        (out, x + residual) (see normed_sublayer)."""
        if norm is None:
            return self.down_proj.forward_silu_and_mul(self.gate_up_proj(x))
        gate_up, residual = self.gate_up_proj.forward_normed(x, residual, norm)
        return self.down_proj.forward_silu_and_mul(gate_up), residual


def normed_sublayer(sublayer: nn.Module, norm: nn.Module, hidden: torch.Tensor, residual: torch.Tensor | None,
                    *args) -> tuple[torch.Tensor, torch.Tensor]:
    """(sublayer(*args, norm(hidden + residual)), hidden + residual); residual None: norm(hidden) and hidden. A
    sublayer with `fuses_input_norm` takes the norm with its unnormed input and runs it in its first projection's
    GEMM (one kernel for a one-row decode on GPU); others get the normed input."""
    if getattr(sublayer, "fuses_input_norm", False):
        return sublayer(*args, hidden, residual, norm)
    hidden, residual = (norm(hidden), hidden) if residual is None else norm(hidden, residual)
    return sublayer(*args, hidden), residual


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: AtomConfig, layer_idx: int, prefix: str, qk_norm: bool,
                 rotary_emb: RotaryEmbedding, mlp: nn.Module, attention_cls: type[nn.Module] = LlamaAttention) -> None:
        super().__init__()
        cfg = config.hf_config
        self.self_attn = attention_cls(config, layer_idx, f"{prefix}.self_attn", qk_norm, rotary_emb)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions, hidden, residual):
        hidden, residual = normed_sublayer(self.self_attn, self.input_layernorm, hidden, residual, positions)
        return normed_sublayer(self.mlp, self.post_attention_layernorm, hidden, residual)


def dense_mlp(config: AtomConfig, layer_idx: int) -> nn.Module:
    return LlamaMLP(config.hf_config)


class LlamaModel(nn.Module):
    """`build_mlp(config, layer_idx)` makes each layer's MLP (MoE models put their expert layers there);
    `attention_cls` each layer's attention (DeepSeek: MLA)."""

    def __init__(self, config: AtomConfig, prefix: str = "model", qk_norm: bool = False,
                 build_mlp: Callable[[AtomConfig, int], nn.Module] = dense_mlp,
                 attention_cls: type[nn.Module] = LlamaAttention) -> None:
        super().__init__()
        cfg = config.hf_config
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        # One cos|sin table [max_model_len, rotary_dim] for all layers (a table per layer cost GiBs).
        self.rotary_emb = get_rope(cfg, attention_cls.rope_dim(cfg), config.max_model_len)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, f"{prefix}.layers.{i}", qk_norm, self.rotary_emb, build_mlp(config, i),
                              attention_cls)
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    qk_norm = False
    build_mlp = staticmethod(dense_mlp)
    attention_cls: type[nn.Module] = LlamaAttention
    # checkpoint name fragment → (our packed parameter, shard id)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: AtomConfig, prefix: str = "") -> None:
        super().__init__()
        cfg = config.hf_config
        self.config = config
        model_prefix = f"{prefix}.model" if prefix else "model"
        self.model = LlamaModel(config, model_prefix, self.qk_norm, self.build_mlp, self.attention_cls)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)
        # Pick the kernels now, outside any torch.compile trace (hosts compile with fullgraph=True).
        atom_kernels.dispatch.resolve(self.lm_head.weight.device.type)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        """input_ids, positions: [T] → final hidden states [T, hidden_size]."""
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        skip = ("rotary_emb.inv_freq",) + (("lm_head.weight",) if self.tie_word_embeddings else ())
        return load_named_weights(self, weights, self.packed_modules_mapping, skip)
