"""Every supported rope type equals transformers' own inverse frequencies and cos/sin scaling."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from atom_core.layers.rotary import get_rope

ROPES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                    "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("name", list(ROPES))
@pytest.mark.parametrize("max_model_len", [128, 512])
def test_cos_sin_match_transformers(name, max_model_len):
    params = dict(ROPES[name], rope_theta=10000.0)
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=4, max_position_embeddings=256, rope_parameters=params)
    rope = get_rope(cfg, 32, max_model_len)
    rope_type = params["rope_type"]
    seq_len = max(max_model_len, 256) if rope_type == "dynamic" else None
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", seq_len=seq_len)
    pos = torch.arange(rope.cos_sin_cache.shape[0], dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :].float()
    expected = torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)
    torch.testing.assert_close(rope.cos_sin_cache, expected, rtol=1e-6, atol=1e-6)


def test_unknown_rope_type_is_a_clear_error():
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4)
    cfg.rope_parameters = {"rope_type": "longrope", "rope_theta": 1e4}
    with pytest.raises(ValueError, match="rope_type='longrope' is not supported; supported: default"):
        get_rope(cfg, 16, 64)
