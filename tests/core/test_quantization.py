"""checkpoint_precision: the one place a checkpoint's quantization and the KV-cache dtype are decided; the layout of
FP8 scales in the layers."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from atom_core.quantization import Fp8Scheme, Precision, checkpoint_precision


def test_kv_cache_dtype_names():
    cfg = LlamaConfig()
    assert checkpoint_precision(cfg, torch.bfloat16, None) == ("auto", None)
    assert checkpoint_precision(cfg, torch.bfloat16, "bfloat16").kv_cache_dtype == "auto"  # the model dtype's "auto"
    assert checkpoint_precision(cfg, torch.float32, "fp8").kv_cache_dtype == "fp8"
    assert checkpoint_precision(cfg, torch.float32, "fp8_e4m3").kv_cache_dtype == "fp8_e4m3"
    with pytest.raises(ValueError, match=r"kv_cache_dtype='float16' is not supported .*; or use the host's own"):
        checkpoint_precision(cfg, torch.bfloat16, "float16", fallback="; or use the host's own")
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8_e5m2' is not supported"):
        checkpoint_precision(cfg, torch.bfloat16, "fp8_e5m2")


def _quantized(quantization_config: dict) -> LlamaConfig:
    cfg = LlamaConfig()
    cfg.quantization_config = quantization_config
    return cfg


class _HostQuant:
    """A host's quant config object, named as vLLM's and SGLang's name theirs."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


def test_fp8_block_format_as_released():
    from tests.fp8_checkpoints import FORMATS

    cfg = _quantized(FORMATS["block"])
    for host in (None, _HostQuant("fp8")):
        precision = checkpoint_precision(cfg, torch.bfloat16, "auto", host_quantization=host)
        assert precision == Precision("auto", Fp8Scheme("fp8", (128, 128), "group", 128))
    cfg = _quantized({"quant_method": "fp8", "activation_scheme": "static", "modules_to_not_convert": ["lm_head"]})
    assert checkpoint_precision(cfg, torch.float32, "fp8").quantization == Fp8Scheme(
        "fp8", None, "static", 0, ("lm_head",))


def test_compressed_tensors_fp8():
    from tests.fp8_checkpoints import FORMATS

    scheme = checkpoint_precision(_quantized(FORMATS["channel"]), torch.bfloat16, None,
                                  host_quantization=_HostQuant("compressed-tensors")).quantization
    assert scheme == Fp8Scheme("compressed-tensors", None, "token", 0, ("lm_head",))
    assert checkpoint_precision(_quantized(FORMATS["static"]), torch.bfloat16, None).quantization.activation == "static"
    assert scheme.is_ignored(["lm_head"]) and not scheme.is_ignored(["model.layers.0.mlp.down_proj"])
    assert Fp8Scheme("compressed-tensors", None, None, ignored=("re:.*mlp\\.gate$",)).is_ignored(
        ["model.layers.3.mlp.gate"])


@pytest.mark.parametrize("config, error", [
    ({"quant_method": "awq", "bits": 4}, r"^ckpt: quant_method 'awq' is not supported by atom-core \(supported: fp8"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, r"^ckpt: fp8 fmt 'e5m2' is not supported \(supported: e4m3\); x$"),
    ({"quant_method": "fp8", "activation_scheme": "per_block"}, "activation_scheme 'per_block' is not supported"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}},
     "format 'pack-quantized' is not supported"),
])
def test_unsupported_quantization_is_refused_by_name(config, error):
    with pytest.raises(ValueError, match=error):
        checkpoint_precision(_quantized(config), torch.bfloat16, "auto", model="ckpt", fallback="; x")


def test_host_quantization_must_be_the_checkpoints():
    with pytest.raises(ValueError, match=r"not a quantized checkpoint, but the host quantizes it \(fp8\).*; x$"):
        checkpoint_precision(LlamaConfig(), torch.bfloat16, "auto", host_quantization=_HostQuant("fp8"),
                             fallback="; x")
    with pytest.raises(ValueError, match="the host quantizes with 'awq' but the checkpoint is 'fp8'"):
        checkpoint_precision(_quantized({"quant_method": "fp8"}), torch.bfloat16, "auto",
                             host_quantization=_HostQuant("awq"))


def test_scales_in_the_layers_layout():
    from atom_core.layers.fp8 import expand_scale

    block = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # a [200, 256] weight's 128x128 blocks
    rows = expand_scale(block, 200, 2, (128, 128), "w")
    assert rows.shape == (200, 2) and rows[127].tolist() == [1, 2]
    assert rows[128].tolist() == rows[199].tolist() == [3, 4]
    assert expand_scale(torch.tensor([[0.5], [0.25]]), 2, 3, None, "w").tolist() == [[0.5] * 3, [0.25] * 3]
    assert expand_scale(torch.tensor(0.5), 2, 1, None, "w").tolist() == [[0.5], [0.5]]
    with pytest.raises(ValueError, match=r"scale shape mismatch for w: checkpoint \(3, 2\)"):
        expand_scale(torch.ones(3, 2), 200, 2, (128, 128), "w")
