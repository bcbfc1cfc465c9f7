"""Checkpoint loading: sharded files, dtype casting, and the errors a user can hit."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from atom_core.config import AtomConfig, parse_dtype
from atom_core.loader import load_hf_config, load_model, safetensors_files
from atom_frontends.native.hooks import NATIVE


def _load(path, dtype=torch.float32):
    with NATIVE.scope():
        cfg = AtomConfig(hf_config=load_hf_config(path), model_path=str(path), dtype=dtype, max_model_len=64)
        return load_model(cfg, torch.device("cpu"))


def test_sharded_checkpoint_loads_every_tensor(checkpoint_factory, tmp_path):
    from transformers import AutoModelForCausalLM

    src = checkpoint_factory("LlamaForCausalLM")
    hf = AutoModelForCausalLM.from_pretrained(str(src))
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(safetensors_files(tmp_path)) > 2
    model = _load(tmp_path)
    ref = hf.state_dict()
    qkv = model.model.layers[1].self_attn.qkv_proj.weight
    expected = torch.cat([ref[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv"])
    torch.testing.assert_close(qkv, expected, rtol=0, atol=0)
    torch.testing.assert_close(model.lm_head.weight, ref["lm_head.weight"], rtol=0, atol=0)


def test_tied_embeddings_share_storage(checkpoint_factory):
    model = _load(checkpoint_factory("Qwen3ForCausalLM"))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_dtype_cast(checkpoint_factory):
    model = _load(checkpoint_factory("Qwen3ForCausalLM"), torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_unexpected_weight_is_named(checkpoint_factory, tmp_path):
    from safetensors.torch import load_file, save_file

    dst = tmp_path / "ckpt"
    shutil.copytree(checkpoint_factory("LlamaForCausalLM"), dst)
    tensors = load_file(dst / "model.safetensors")
    tensors["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="unexpected weight 'model.layers.0.mlp.extra_proj.weight'"):
        _load(dst)


def test_missing_shard_and_missing_files(checkpoint_factory, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(checkpoint_factory("LlamaForCausalLM"), dst)
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="missing.*model-00002.safetensors"):
        safetensors_files(dst)
    (dst / "model.safetensors.index.json").unlink()
    (dst / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors weights"):
        safetensors_files(dst)
    (dst / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json.*is missing"):
        load_hf_config(dst)


def test_parse_dtype():
    assert parse_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'float7'"):
        parse_dtype("float7")
