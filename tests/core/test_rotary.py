"""Every supported rope type equals transformers' own inverse frequencies and cos/sin scaling, under
transformers 4.x and 5.x; a model holds one table, sized to max_model_len."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from atom_core.config import AtomConfig
from atom_core.layers.rotary import RotaryEmbedding, get_rope
from atom_core.loader import load_hf_config, load_model
from atom_frontends.native.hooks import NATIVE

MAX_POS = 256
ROPES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    # transformers 4.x reads the pretraining length from max_position_embeddings; 5 copies it into the dict
    "yarn-no-original": {"rope_type": "yarn", "factor": 4.0},
    "yarn-mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                    "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16},
    "yarn-attention-factor-untruncated": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                          "attention_factor": 1.5, "truncate": False},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


def _config(scaling: dict) -> LlamaConfig:
    # rope_theta + rope_scaling: the 4.x form, which transformers 5 converts into rope_parameters.
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=4, max_position_embeddings=MAX_POS, rope_theta=10000.0,
                      rope_scaling=dict(scaling))
    rope = getattr(cfg, "rope_parameters", None) or cfg.rope_scaling  # what transformers itself will read
    assert rope["rope_type"] == scaling["rope_type"], rope
    return cfg


def _table(inv_freq: torch.Tensor, scaling: float, rows: int) -> torch.Tensor:
    freqs = torch.arange(rows, dtype=torch.float32)[:, None] * inv_freq[None, :].float()
    return torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)


@pytest.mark.parametrize("name", list(ROPES))
@pytest.mark.parametrize("max_model_len", [128, 512])
def test_cos_sin_match_transformers(name, max_model_len):
    cfg = _config(ROPES[name])
    rope = get_rope(cfg, 32, max_model_len)
    rope_type = ROPES[name]["rope_type"]
    # dynamic: transformers' formula at the one point we evaluate it (rotary.py's docstring)
    seq_len = max(max_model_len, MAX_POS) if rope_type == "dynamic" else None
    expected = _table(*ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", seq_len=seq_len), max_model_len)
    assert rope.cos_sin_cache.shape == (max_model_len, 32)
    torch.testing.assert_close(rope.cos_sin_cache, expected, rtol=1e-6, atol=1e-6)
    unscaled = _table(1.0 / 10000.0 ** (torch.arange(0, 32, 2) / 32), 1.0, max_model_len)  # plain RoPE
    scales = rope_type != "dynamic" or max_model_len > MAX_POS  # dynamic within MAX_POS is the plain base
    assert scales == (not torch.allclose(expected, unscaled, atol=1e-3))  # so the comparison above can fail


def test_unknown_rope_type_is_a_clear_error():
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4)
    cfg.rope_parameters = {"rope_type": "longrope", "rope_theta": 1e4}
    with pytest.raises(ValueError, match="rope_type='longrope' is not supported; supported: default"):
        get_rope(cfg, 16, 64)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_one_table_per_model_sized_to_max_model_len(checkpoint_factory, arch):
    path = checkpoint_factory(arch, num_hidden_layers=3)
    with NATIVE.scope():
        cfg = AtomConfig(hf_config=load_hf_config(path), model_path=str(path), max_model_len=96)
        model = load_model(cfg, torch.device("cpu"))
    ropes = [m for _, m in model.named_modules(remove_duplicate=False) if isinstance(m, RotaryEmbedding)]
    assert len(ropes) == 1 + 3  # the model's own and each layer's reference to it
    assert len({r.cos_sin_cache.data_ptr() for r in ropes}) == 1
    assert all(layer.self_attn.rotary_emb is model.model.rotary_emb for layer in model.model.layers)
    head_dim = cfg.hf_config.head_dim
    assert model.model.rotary_emb.cos_sin_cache.shape == (96, head_dim)  # max_model_len rows, not 512
