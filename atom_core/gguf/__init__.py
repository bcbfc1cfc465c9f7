"""GGUF checkpoints (llama.cpp's format): read with the `gguf` package, dequantized, converted once into a cached HF
checkpoint directory that every host loads like any other. See docs/gguf.md."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from atom_core.gguf.convert import cache_root, convert_gguf, converted_dir, find_gguf
from atom_core.gguf.reader import INSTALL_GGUF, GGUFFile

__all__ = ["GGUFFile", "INSTALL_GGUF", "cache_root", "convert_gguf", "converted_dir", "find_gguf",
           "resolve_checkpoint"]
log = logging.getLogger(__name__)


def resolve_checkpoint(model: str | os.PathLike, dtype: str = "auto") -> str:
    """`model` itself for an HF checkpoint directory; for a GGUF (file, or directory holding one) its converted
    checkpoint, with one log line on the dtype its weights are dequantized to and the memory that costs."""
    gguf_path = find_gguf(model)
    if gguf_path is None:
        return str(model)
    out = convert_gguf(gguf_path)
    from atom_core.config import parse_dtype

    config = json.loads((out / "config.json").read_text())
    target = parse_dtype(dtype, type("Config", (), {"torch_dtype": config["torch_dtype"]}))
    log.info("%s: weights dequantized to %s at load: %.0f MiB in memory, the GGUF file is %.0f MiB (converted "
             "checkpoint: %s)", gguf_path.name, str(target).removeprefix("torch."),
             _param_count(out) * target.itemsize / 2**20, gguf_path.stat().st_size / 2**20, out)
    return str(out)


def _param_count(checkpoint: Path) -> int:
    from safetensors import safe_open

    total = 0
    for file in checkpoint.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                n = 1
                for d in f.get_slice(name).get_shape():
                    n *= d
                total += n
    return total
