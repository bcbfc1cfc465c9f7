"""load_format="dummy": a model runs from its config.json alone (no weight files) with atom_core.dummy_weights'
random weights, as under vLLM's and SGLang's --load-format dummy: every parameter filled (e4m3 weights too, with
scales that put them in the same range), the same weights for the same seed, tokens produced; "auto" still needs
the weight files."""

from __future__ import annotations

import json

import pytest
import torch

from atom_core.dummy_weights import FP8_RANGE, HIGH
from atom_frontends.native import LLM, SamplingParams
from atom_frontends.native.demo import build_checkpoint
from tests.fp8_checkpoints import FORMATS

CASES = {  # name → (architecture, quantization_config or None)
    "qwen3": ("Qwen3ForCausalLM", None),
    "qwen3-moe-fp8": ("Qwen3MoeForCausalLM", FORMATS["block"]),
    "deepseek-v3": ("DeepseekV3ForCausalLM", None),
}


def config_only(tmp_path, arch: str, quantization: dict | None, **overrides):
    """A test checkpoint's folder as build_checkpoint(weights=False) writes it: config.json and the tokenizer
    (`overrides`: config fields)."""
    path = build_checkpoint(tmp_path / arch, arch, weights=False, **overrides)
    assert not list(path.glob("*.safetensors"))
    if quantization:
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
    return path


@pytest.mark.parametrize("name", list(CASES))
def test_dummy_weights_run_from_the_config_alone(tmp_path, name):
    arch, quantization = CASES[name]
    path = config_only(tmp_path, arch, quantization)
    llm = LLM(str(path), load_format="dummy", dtype="float32", max_model_len=128, num_kv_blocks=64)
    params = dict(llm.engine.model.named_parameters())
    for pname, p in params.items():
        values = p.detach().float()
        assert values.isfinite().all() and values.abs().max() > 0, f"{pname} was not filled"
        if p.dtype == torch.float8_e4m3fn:
            assert values.abs().max() > 100, f"{pname}: e4m3 weights must span the format"
        elif "scale" in pname.rsplit(".", 1)[-1]:
            assert torch.all(values == HIGH / FP8_RANGE), pname
        else:
            assert values.abs().max() <= HIGH, pname
    assert any(p.dtype == torch.float8_e4m3fn for p in params.values()) == (quantization is not None)
    out = llm.generate([[1, 2, 3, 4, 5]], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    again = LLM(str(path), load_format="dummy", dtype="float32", max_model_len=128, num_kv_blocks=64)
    for pname, p in again.engine.model.named_parameters():
        assert torch.equal(p.detach().float(), params[pname].detach().float()), f"{pname}: seed 0 differs"


def test_load_formats(tmp_path):
    path = config_only(tmp_path, "Qwen3ForCausalLM", None)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors weights"):
        LLM(str(path), dtype="float32", num_kv_blocks=64)
    with pytest.raises(ValueError, match="load_format='npz' is not supported"):
        LLM(str(path), load_format="npz")
