"""Multi-head latent attention (DeepSeek-V2/V3), as transformers' DeepseekV2Attention / DeepseekV3Attention
compute it, run in the absorbed form over a latent cache.

Per token: q = q_proj(h) or q_b_proj(q_a_layernorm(q_a_proj(h))) → [H, nope + rope];
kv_a_proj_with_mqa(h) → [r + rope] = (latent c, shared rope key k_pe); c = kv_a_layernorm(c);
kv_b_proj [H*(nope + v), r] holds W_UK [H, nope, r] and W_UV [H, v, r] (per head, nope rows then v rows).
transformers expands K = [W_UK c, k_pe], V = W_UV c per head. We fold W_UK into the query instead
(q_latent = [q_nope W_UK, q_pe], [T, H, r + rope]), cache one row [c, k_pe] per token, attend over the rows
(values: their first r features) and apply W_UV to the output: the same logits and outputs, one cache row of
r + rope per token instead of H * (nope + rope + v). Prefill runs the absorbed form too (expanding the latent
for long prefills is a later speed option).

Rope: DeepSeek rotates interleaved pairs (x0, x1), (x2, x3), ... (V2's complex form and V3's
rope_interleave=True are the same maths). We de-interleave q_pe and k_pe into [evens, odds] and run the
neox rotary op: that yields the rotated pairs in another order, the same for q and k, so every logit is
unchanged. Yarn: the rotary table carries mscale / mscale_all_dim; the softmax scale gets mscale_all_dim's
correction squared (transformers' yarn_apply_mscale).
"""

from __future__ import annotations

import torch
from torch import nn

from atom_core.config import AtomConfig
from atom_core.layers.attention import MLA_OPS, Attention
from atom_core.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear, _divide
from atom_core.layers.norm import RMSNorm
from atom_core.layers.rotary import RotaryEmbedding, rope_parameters, yarn_mscale
from atom_core.plugins import current_platform

# transformers (and DeepSeek's reference code) build q_a_layernorm / kv_a_layernorm with the default eps,
# not config.rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def mla_softmax_scale(cfg) -> float:
    """qk_head_dim ** -0.5, times yarn's mscale(factor, mscale_all_dim) ** 2 for a scaled rope."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    p = rope_parameters(cfg)
    if p["rope_type"] != "default" and p.get("mscale_all_dim"):
        scale *= yarn_mscale(p["factor"], p["mscale_all_dim"]) ** 2
    return scale


def _deinterleave(x: torch.Tensor) -> torch.Tensor:
    """[..., d] interleaved pairs → [..., d] as [evens, odds] (the layout the neox rotary op rotates)."""
    return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)


class MLAAttention(nn.Module):
    """DeepSeek MLA: hidden [T, hidden_size] → [T, hidden_size]. Heads are split over tensor-parallel ranks
    (q_proj / q_b_proj / kv_b_proj by rows, o_proj by columns); the latent projections are replicated."""

    kernel_ops = MLA_OPS

    @staticmethod
    def rope_dim(cfg) -> int:
        return cfg.qk_rope_head_dim

    def __init__(self, config: AtomConfig, layer_idx: int, prefix: str, qk_norm: bool,
                 rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        cfg = config.hf_config
        hidden, heads = cfg.hidden_size, cfg.num_attention_heads
        self.r, self.rope, self.nope, self.v_dim = (cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim,
                                                    cfg.v_head_dim)
        qk_dim, bias = self.nope + self.rope, bool(getattr(cfg, "attention_bias", False))
        self.num_heads = _divide(heads, current_platform().tp_size, "num_attention_heads")
        q_lora = getattr(cfg, "q_lora_rank", None)
        self.has_q_lora = bool(q_lora)
        if q_lora:
            self.q_a_proj = ReplicatedLinear(hidden, q_lora, bias)
            self.q_a_layernorm = RMSNorm(q_lora, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(q_lora, heads * qk_dim)
        else:
            self.q_proj = ColumnParallelLinear(hidden, heads * qk_dim)
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, self.r + self.rope, bias)
        self.kv_a_layernorm = RMSNorm(self.r, LATENT_NORM_EPS)
        self.kv_b_proj = ColumnParallelLinear(self.r, heads * (self.nope + self.v_dim))
        # absorbed: its weight is read below, not run as a GEMM; an fp8 one is dequantized once at load (the latent
        # stays unquantized, as in DeepSeek's own absorbed inference)
        self.kv_b_proj.dequantize_after_load = True
        self.o_proj = RowParallelLinear(heads * self.v_dim, hidden, bias)
        self.rotary_emb = rotary_emb  # the model's one table over qk_rope_head_dim
        self.interleaved = bool(getattr(cfg, "rope_interleave", True))  # V2 has no flag: always interleaved
        self.attn = Attention(self.num_heads, self.r + self.rope, mla_softmax_scale(cfg), 1,
                              kv_cache_dtype=config.kv_cache_dtype, prefix=f"{prefix}.attn",
                              kv_lora_rank=self.r, qk_rope_head_dim=self.rope)

    def _query(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.has_q_lora:
            return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        return self.q_proj(hidden)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        t, h = hidden.shape[0], self.num_heads
        q_nope, q_pe = self._query(hidden).view(t, h, self.nope + self.rope).split([self.nope, self.rope], -1)
        c, k_pe = self.kv_a_proj_with_mqa(hidden).split([self.r, self.rope], -1)
        if self.interleaved:
            q_pe, k_pe = _deinterleave(q_pe), _deinterleave(k_pe)
        q_pe, k_pe = self.rotary_emb(positions, q_pe, k_pe.reshape(t, 1, self.rope))
        # kv_b_proj rows per head: nope rows of W_UK, then v rows of W_UV; each [rows, r]
        w_uk, w_uv = self.kv_b_proj.weight.view(h, self.nope + self.v_dim, self.r).split([self.nope, self.v_dim], 1)
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, r]
        latent = torch.cat([self.kv_a_layernorm(c), k_pe.view(t, self.rope)], dim=-1)  # [T, r + rope]
        out = self.attn(torch.cat([q_latent, q_pe], dim=-1), latent)  # [T, H, r]
        out = torch.bmm(out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)  # [T, H, v]
        return self.o_proj(out.reshape(t, h * self.v_dim))
