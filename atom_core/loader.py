"""Build atom-core models from a host's config, and load local HF checkpoints (config.json + one or many
safetensors files) into them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import safe_open

from atom_core.config import AtomConfig
from atom_core.layers.fp8 import quantize_model
from atom_core.models.registry import get_model_class
from atom_core.platform import Platform
from atom_core.plugins import current_host, current_platform, hook


def _require_dir(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"model directory {str(p)!r} does not exist; pass a local HF checkpoint "
                                "directory (config.json + *.safetensors)")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{str(p / 'config.json')!r} is missing: not a HF checkpoint directory")
    return p


def load_hf_config(path: str | os.PathLike):
    """transformers config of a local checkpoint (never touches the network)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(_require_dir(path)), local_files_only=True)


def safetensors_files(path: str | os.PathLike) -> list[Path]:
    p = _require_dir(path)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (p / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists shard(s) that are missing: {missing}")
        return [p / n for n in names]
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {str(p)!r} (only safetensors checkpoints "
                                "are supported; convert .bin files with transformers' save_pretrained)")
    return files


def iterate_weights(path: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every safetensors file, in file order."""
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


class BuiltModel(NamedTuple):
    model: torch.nn.Module  # weights uninitialised
    config: AtomConfig
    platform: Platform


def build_model(host_config: Any, *, architecture: str | None = None, prefix: str = "") -> BuiltModel:
    """A model built from a host's own config object (EngineArgs, VllmConfig, SGLang's): the frontend that
    recognises it translates it (atom_translate_config), the current host's platform gives the device; the class
    is the registered one for `architecture` (default: the checkpoint's). Weights uninitialised."""
    config = hook().atom_translate_config(host_config=host_config)
    if config is None:
        raise TypeError(f"no atom-core frontend recognises a host config of type {type(host_config).__qualname__} "
                        f"(host {current_host()!r}); pass the host's own config object (EngineArgs, VllmConfig, "
                        "SGLangModelConfig)")
    platform = current_platform()
    return BuiltModel(instantiate(config, platform.device, architecture, prefix), config, platform)


def instantiate(config: AtomConfig, device: torch.device, architecture: str | None = None,
                prefix: str = "") -> torch.nn.Module:
    """Instantiate the registered class for `architecture` (default: the checkpoint's), weights
    uninitialised, in config.dtype on `device` (fp8 where config.quantization says the checkpoint is)."""
    cls = get_model_class(architecture or config.architecture)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(config.dtype)
    try:
        with torch.device(device):
            model = cls(config, prefix=prefix).eval()
            quantize_model(model, config.quantization, getattr(model, "packed_modules_mapping", {}))
            return model
    finally:
        torch.set_default_dtype(prev)


def load_model(config: AtomConfig, device: torch.device) -> torch.nn.Module:
    """Build the model and load every parameter from config.model_path; missing weights are an error."""
    model = instantiate(config, device)
    load_weights(model, config.model_path)
    return model


def load_weights(model: torch.nn.Module, model_path: str | None) -> None:
    """Load every parameter of `model` from the checkpoint at model_path (missing weights are an error), then
    ready them for the kernels (prepare_weights)."""
    if model_path is None:
        raise ValueError("AtomConfig.model_path is not set: nothing to load weights from")
    require_all_loaded(model, model.load_weights(iterate_weights(model_path)), model_path)
    prepare_weights(model)


def prepare_weights(model: torch.nn.Module) -> None:
    """Once every weight is loaded: each layer with a `prepare_weights()` readies its weights for its kernels
    (linear layers let atom_kernels.pack_linear prepack them). Hosts call it after their own loading."""
    for module in model.modules():
        if hasattr(module, "prepare_weights"):
            module.prepare_weights()


def require_all_loaded(model: torch.nn.Module, loaded: set[str], model_path: str | None) -> None:
    """Raise naming the parameters of `model` that the checkpoint gave no data (`loaded`: names that got some)."""
    missing = sorted(set(dict(model.named_parameters())) - loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (f" … ({len(missing)} in all)" if len(missing) > 8 else "")
        raise ValueError(f"checkpoint {model_path!r} lacks weights for: {shown}")
