"""Mapping checkpoint tensors onto a model's (possibly packed, sharded) parameters."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn


def load_named_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    packed: dict[str, tuple[str, object]],
    skip_suffixes: tuple[str, ...] = (),
) -> set[str]:
    """Load (checkpoint_name, tensor) pairs; return the names of every parameter that got data.

    `packed` maps a checkpoint name fragment (e.g. "q_proj") to (our parameter fragment, shard id).
    Raises ValueError naming a checkpoint tensor that matches no parameter.
    """
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        if name.endswith(skip_suffixes):
            continue
        # the fp8 block format (DeepSeek-V3, Qwen3-FP8) names its scales weight_scale_inv (dequantized = weight *
        # weight_scale_inv); compressed-tensors, the same factor, weight_scale: ours
        name = name.removesuffix("_inv") if name.endswith(".weight_scale_inv") else name
        target, shard = _resolve(name, params, packed)
        param = params[target]
        loader = getattr(param, "weight_loader", None)
        if loader is None:
            if param.shape != tensor.shape:
                raise ValueError(f"weight shape mismatch for {name}: checkpoint {tuple(tensor.shape)}, "
                                 f"model expects {tuple(param.shape)}")
            param.data.copy_(tensor)
        elif shard is None:
            loader(param, tensor)
        else:
            loader(param, tensor, shard)
        loaded.add(target)
    return loaded


# transformers' per-expert checkpoint names → the MoE layer's stacked parameter (its fp8 scales: *_scale) and shard
# (expert, part)
_EXPERT = re.compile(r"^(?P<experts>(?:.+\.)?experts)\.(?P<index>\d+)\.(?P<part>gate|up|down)_proj\."
                     r"weight(?P<scale>_scale)?$")


def _resolve(name: str, params: dict, packed: dict) -> tuple[str, object]:
    if name in params:
        return name, None
    expert = _EXPERT.match(name)
    if expert is not None:
        stack = "down_proj" if expert["part"] == "down" else "gate_up_proj"
        target = f"{expert['experts']}.{stack}{expert['scale'] or ''}"
        if target in params:
            return target, (int(expert["index"]), expert["part"])
    for fragment, (ours, shard) in packed.items():
        key = f".{fragment}."
        if key in name:
            target = name.replace(key, f".{ours}.")
            if target in params:
                return target, shard
    raise ValueError(
        f"unexpected weight {name!r} in the checkpoint: no model parameter matches it "
        f"(is the checkpoint for a different architecture or config?)"
    )
