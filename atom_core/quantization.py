"""A checkpoint's quantization and the KV-cache dtype: the one place every host's config translation asks.

Each frontend's `atom_translate_config` answer calls `checkpoint_precision` with what its host knows (the HF config,
the model dtype, the KV-cache dtype the user asked for, the host's own quantization object if it made one, e.g.
vLLM's Fp8Config / CompressedTensorsConfig or SGLang's); the AtomConfig it builds carries the result. Quantized
weights: FP8 (e4m3) checkpoints, as `Fp8Scheme` (atom_core.layers.fp8 gives the layers their fp8 parameters):
  - quant_method "fp8" (DeepSeek-V3, Qwen3-FP8): `weight_scale_inv` per weight_block_size block (or one
    `weight_scale` per tensor without a block size); activations "dynamic" per token and group of the block's
    columns, or "static" with a per-tensor `input_scale`.
  - "compressed-tensors" float-quantized 8-bit: `weight_scale` per channel, tensor or block; activations dynamic
    per token or group, static per tensor, or none (weight-only).
Any other method is refused by name, as is a host quantizing an unquantized checkpoint itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

# What our attention kernels store: the model dtype ("auto") or fp8 e4m3 with per-tensor scales.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
_FLOAT_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
SUPPORTED = ("fp8 (e4m3, block / per-tensor weight scales, dynamic or static activations)",
             "compressed-tensors (float-quantized 8-bit: channel / tensor / block weight scales)")


@dataclass(frozen=True)
class Fp8Scheme:
    """FP8 e4m3 weights of every linear layer and MoE expert the checkpoint does not list in `ignored`.

    weight_block: (rows, cols) one weight scale covers; None: one per output channel or one per tensor (the
    checkpoint's scale shapes say which: atom_core.layers.fp8.expand_scale).
    activation: "group" (dynamic, per token and act_group columns), "token" (dynamic per token), "static"
    (per-tensor `input_scale` tensors) or None (weights only)."""

    method: str
    weight_block: tuple[int, int] | None
    activation: str | None
    act_group: int = 0
    ignored: tuple[str, ...] = ()

    def is_ignored(self, names: list[str]) -> bool:
        """Do the checkpoint's `ignore` / `modules_to_not_convert` entries name one of these (checkpoint) module
        names? Entries: a name, a name's last components, or "re:<regex>" (compressed-tensors)."""
        for entry in self.ignored:
            for name in names:
                if (re.fullmatch(entry[3:], name) if entry.startswith("re:")
                        else name == entry or name.endswith("." + entry)):
                    return True
        return False


class Precision(NamedTuple):
    kv_cache_dtype: str  # AtomConfig.kv_cache_dtype
    quantization: Fp8Scheme | None  # AtomConfig.quantization: None for unquantized weights


def checkpoint_precision(hf_config: Any, dtype: torch.dtype, kv_cache_dtype: str | None, *,
                         host_quantization: Any = None, model: str = "the model", fallback: str = "") -> Precision:
    """→ the AtomConfig's kv_cache_dtype and quantization for this checkpoint and request; raises ValueError for
    what atom-core cannot run. kv_cache_dtype: the host's name ("auto", "fp8", "fp8_e4m3", or a float type equal to
    `dtype`, which is "auto"); host_quantization: the host's quantization object (vLLM's/SGLang's quant_config) or
    None; fallback: the host's way to run the model without atom-core, appended to errors (e.g. "; or set ...")."""
    quantization = weight_quantization(hf_config, host_quantization, model, fallback)
    requested = kv_cache_dtype or "auto"
    if requested == _FLOAT_NAMES.get(dtype):
        return Precision("auto", quantization)
    if requested not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={requested!r} is not supported by atom-core's attention (supported: "
                         f"{', '.join(KV_CACHE_DTYPES)}, or the model dtype); pick one of those{fallback}")
    return Precision(requested, quantization)


def weight_quantization(hf_config: Any, host_quantization: Any, model: str, fallback: str) -> Fp8Scheme | None:
    """The checkpoint's quantization_config as an Fp8Scheme (None: unquantized), checked against the host's."""
    quant = getattr(hf_config, "quantization_config", None)
    host_method = _host_method(host_quantization)
    if quant is None:
        if host_method is not None:
            raise ValueError(f"{model} is not a quantized checkpoint, but the host quantizes it ({host_method}): "
                             f"atom-core loads quantized checkpoints only (supported: {'; '.join(SUPPORTED)}); "
                             f"serve it without a quantization option or serve an FP8 checkpoint{fallback}")
        return None
    quant = quant if isinstance(quant, dict) else quant.to_dict()
    method = quant.get("quant_method")
    parse = {"fp8": _fp8_method, "compressed-tensors": _compressed_tensors}.get(method)
    if parse is None:
        raise ValueError(f"{model}: quant_method {method!r} is not supported by atom-core (supported: "
                         f"{'; '.join(SUPPORTED)}); use such a checkpoint or a bf16 one{fallback}")
    if host_method is not None and host_method != method:
        raise ValueError(f"{model}: the host quantizes with {host_method!r} but the checkpoint is {method!r}; "
                         f"drop the host's quantization option{fallback}")
    try:
        return parse(quant)
    except ValueError as e:
        raise ValueError(f"{model}: {e}{fallback}") from None


def _host_method(host_quantization: Any) -> str | None:
    """vLLM's and SGLang's quant configs name their method with get_name(); the plain name for other objects."""
    if host_quantization is None:
        return None
    get_name = getattr(host_quantization, "get_name", None)
    return str(get_name()) if callable(get_name) else type(host_quantization).__name__


def _fp8_method(quant: dict) -> Fp8Scheme:
    if quant.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"fp8 fmt {quant['fmt']!r} is not supported (supported: e4m3)")
    scheme = quant.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise ValueError(f"fp8 activation_scheme {scheme!r} is not supported (supported: dynamic, static)")
    block = quant.get("weight_block_size")
    if block is not None and (len(block) != 2 or min(block) < 1):
        raise ValueError(f"fp8 weight_block_size {block!r} must be [rows, cols]")
    if block is not None and scheme == "static":
        raise ValueError("fp8 with weight_block_size and static activations is not supported (supported: dynamic)")
    ignored = tuple(quant.get("modules_to_not_convert") or quant.get("ignored_layers") or ())
    if block is None:
        return Fp8Scheme("fp8", None, "static" if scheme == "static" else "token", ignored=ignored)
    return Fp8Scheme("fp8", (int(block[0]), int(block[1])), "group", int(block[1]), ignored)


def _compressed_tensors(quant: dict) -> Fp8Scheme:
    if quant.get("format") not in ("float-quantized", None):
        raise ValueError(f"compressed-tensors format {quant.get('format')!r} is not supported (supported: "
                         "float-quantized)")
    if quant.get("kv_cache_scheme"):
        raise ValueError("compressed-tensors kv_cache_scheme is not supported (use kv_cache_dtype instead)")
    groups = list((quant.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors with {len(groups)} config_groups is not supported (supported: one)")
    weights, inputs = groups[0].get("weights") or {}, groups[0].get("input_activations")
    for what, args in (("weights", weights), ("input_activations", inputs or weights)):
        if (args.get("type"), args.get("num_bits"), args.get("symmetric", True)) != ("float", 8, True):
            raise ValueError(f"compressed-tensors {what} {args} are not supported (supported: symmetric 8-bit "
                             "float)")
    strategy = weights.get("strategy")
    if strategy not in ("channel", "tensor", "block"):
        raise ValueError(f"compressed-tensors weight strategy {strategy!r} is not supported (supported: channel, "
                         "tensor, block)")
    block = tuple(weights.get("block_structure") or ()) if strategy == "block" else None
    activation, act_group = _ct_activations(inputs)
    return Fp8Scheme("compressed-tensors", block, activation, act_group,
                     tuple(quant.get("ignore") or ()))


def _ct_activations(inputs: dict | None) -> tuple[str | None, int]:
    if inputs is None:
        return None, 0
    strategy, dynamic = inputs.get("strategy"), bool(inputs.get("dynamic"))
    if dynamic and strategy == "token":
        return "token", 0
    if dynamic and strategy == "group" and inputs.get("group_size"):
        return "group", int(inputs["group_size"])
    if not dynamic and strategy == "tensor":
        return "static", 0
    raise ValueError(f"compressed-tensors input_activations strategy {strategy!r} (dynamic={dynamic}) is not "
                     "supported (supported: dynamic token or group, static tensor)")
