"""checkpoint_precision: the one place a checkpoint's quantization and the KV-cache dtype are decided."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from atom_core.quantization import checkpoint_precision


def test_kv_cache_dtype_names():
    cfg = LlamaConfig()
    assert checkpoint_precision(cfg, torch.bfloat16, None) == "auto"
    assert checkpoint_precision(cfg, torch.bfloat16, "bfloat16") == "auto"  # the model dtype is our "auto"
    assert checkpoint_precision(cfg, torch.float32, "fp8") == "fp8"
    assert checkpoint_precision(cfg, torch.float32, "fp8_e4m3") == "fp8_e4m3"
    with pytest.raises(ValueError, match=r"kv_cache_dtype='float16' is not supported .*; or use the host's own"):
        checkpoint_precision(cfg, torch.bfloat16, "float16", fallback="; or use the host's own")
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8_e5m2' is not supported"):
        checkpoint_precision(cfg, torch.bfloat16, "fp8_e5m2")


def test_quantized_checkpoints_and_host_quantization_are_refused_by_name():
    cfg = LlamaConfig()
    cfg.quantization_config = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    with pytest.raises(ValueError, match=r"^ckpt is a quantized checkpoint \(quant_method fp8\): .*unquantized"):
        checkpoint_precision(cfg, torch.bfloat16, "auto", model="ckpt")

    class AWQConfig:
        pass

    with pytest.raises(ValueError, match=r"quantized models \(AWQConfig\) are not supported by atom-core yet; .*; x$"):
        checkpoint_precision(LlamaConfig(), torch.bfloat16, "auto", host_quantization=AWQConfig(), fallback="; x")
