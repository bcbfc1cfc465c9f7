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


BLOCK_SCHEME = Fp8Scheme("fp8", (128, 128), "group", 128)  # the fp8 block format (tests/fp8_checkpoints.py's "block")


def _fp8_block_layer(layer, shards: dict, seed: int = 0):
    """`layer` with the fp8 block format, loaded from a checkpoint tensor per shard ({shard_id: rows}, None: one
    unsharded tensor) quantized as the releases are (tests/fp8_checkpoints.quantize: [ceil(rows / 128), KB] block
    scales), then prepared as the loader does."""
    from tests.fp8_checkpoints import quantize

    layer.use_fp8(BLOCK_SCHEME)
    cols = layer.weight.shape[1] * (layer.tp_size if layer.shards_input else 1)
    g = torch.Generator().manual_seed(seed)
    for shard, rows in shards.items():
        q, block_scale, _ = quantize(torch.randn(rows, cols, generator=g), "block")
        args = () if shard is None else (shard,)
        layer.weight.weight_loader(layer.weight, q, *args)
        layer.weight_scale.weight_loader(layer.weight_scale, block_scale, *args)
    layer.prepare_weights()
    return layer


def test_block_n_says_whether_the_scale_rows_are_whole_blocks():
    """block_n (the fp8 op's word that one scale row per 128-row group suffices) is 128 where every 128-row group of
    the layer's rows lies inside one checkpoint block, and 0 where a fused shard or a tensor-parallel slice starts
    inside a block (the group then holds two blocks' scales)."""
    from atom_core.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )
    from atom_core.platform import Platform

    def tp(rank=0, size=1):
        return Platform("test", torch.device("cpu"), tp_rank=rank, tp_size=size)

    qkv = {"q": 256, "k": 128, "v": 128}  # the test checkpoints' Qwen3: 4 heads, 2 KV heads of 64
    assert _fp8_block_layer(QKVParallelLinear(256, 64, 4, 2, platform=tp()), qkv).block_n == 128
    for rank in (0, 1):  # a rank's q 128 | k 64 | v 64 rows: its second group holds k's block and v's
        assert _fp8_block_layer(QKVParallelLinear(256, 64, 4, 2, platform=tp(rank, 2)), qkv).block_n == 0
    assert _fp8_block_layer(MergedColumnParallelLinear(256, [384, 384], platform=tp()), {0: 384, 1: 384}).block_n == 128
    # gate|up of 320 rows each (the test checkpoints' intermediate size): up starts at row 320, inside group 2
    assert _fp8_block_layer(MergedColumnParallelLinear(256, [320, 320], platform=tp()), {0: 320, 1: 320}).block_n == 0
    # DeepSeek's kv_a_proj_with_mqa: 512 + 64 rows, a partial last block of its own
    assert _fp8_block_layer(ReplicatedLinear(256, 576, platform=tp()), {None: 576}).block_n == 128
    # 384 rows on 2 ranks: rank 0 has rows 0-191 (blocks 0 and 1 whole in its groups), rank 1 starts at row 192
    assert _fp8_block_layer(ColumnParallelLinear(256, 384, platform=tp(0, 2)), {None: 384}).block_n == 128
    assert _fp8_block_layer(ColumnParallelLinear(256, 384, platform=tp(1, 2)), {None: 384}).block_n == 0
    assert _fp8_block_layer(RowParallelLinear(512, 256, platform=tp(1, 2)), {None: 256}).block_n == 128  # K split
    per_channel = ReplicatedLinear(256, 256, platform=tp())
    per_channel.use_fp8(Fp8Scheme("compressed-tensors", None, "token", 0))
    per_channel.prepare_weights()
    assert per_channel.block_n == 0  # no block scales: no block rows to speak of


def test_row_block():
    from atom_core.layers.fp8 import row_block

    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).repeat_interleave(128, 0)[:200]  # a partial last group
    assert row_block(rows, 128) == 128
    assert row_block(rows, 0) == 0 and row_block(rows[:0], 128) == 0
    off = rows.clone()
    off[150, 1] = 5.0  # one row of the second group differs
    assert row_block(off, 128) == 0
    assert row_block(rows.roll(1, 0), 128) == 0  # the block edge one row off


def test_the_layers_pass_block_n_to_the_op(fp8_checkpoint):
    """Loaded through the loader (prepare_weights), the fp8 block checkpoints' layers say block_n as their rows are
    (Qwen3: q|k|v whole blocks at one rank, gate|up cut at row 320; DeepSeek-V3: the 144-row kv_a_proj_with_mqa), and
    the op receives it."""
    from atom_core.config import AtomConfig
    from atom_core.loader import load_hf_config, load_model
    from atom_core.quantization import checkpoint_precision
    from atom_frontends.native.hooks import NATIVE
    from atom_kernels import dispatch
    from tests.fp8_checkpoints import DEEPSEEK_V3, QWEN3

    def load(checkpoint):
        path, _ = fp8_checkpoint(checkpoint, "block")
        hf_config = load_hf_config(path)
        with NATIVE.scope():
            cfg = AtomConfig(hf_config=hf_config, model_path=str(path), max_model_len=64,
                             quantization=checkpoint_precision(hf_config, torch.float32, None).quantization)
            return load_model(cfg, torch.device("cpu"))

    layer = load(QWEN3).model.layers[0]
    assert layer.self_attn.qkv_proj.block_n == layer.self_attn.o_proj.block_n == layer.mlp.down_proj.block_n == 128
    assert layer.mlp.gate_up_proj.block_n == 0
    attn = load(DEEPSEEK_V3).model.layers[0].self_attn
    assert attn.kv_a_proj_with_mqa.weight.shape[0] == 144 and attn.kv_a_proj_with_mqa.block_n == 128
    seen.clear()
    previous = dispatch.register("fp8_linear", "torch", f"{__name__}:_seen_fp8_linear")
    try:
        x = torch.randn(3, 256)
        layer.self_attn.qkv_proj(x), layer.mlp.gate_up_proj(x)
    finally:
        dispatch.register("fp8_linear", "torch", previous)
    assert seen == [128, 0]


seen: list[int] = []


def _seen_fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale=None, bias=None, block_n=0):
    """The reference fp8_linear, noting the block_n it was given."""
    from atom_kernels.reference.fp8 import fp8_linear

    seen.append(block_n)
    return fp8_linear(x, weight, weight_scale, block_k, act_group, input_scale, bias, block_n)
