"""GGUF → a cached HF checkpoint directory (config.json, float32 safetensors, tokenizer), converted once."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from atom_core.gguf.hf_config import hf_architecture, hf_config
from atom_core.gguf.reader import GGUFFile
from atom_core.gguf.tensors import check_tensor_types, hf_tensors
from atom_core.gguf.tokenizer import save_tokenizer, stop_token_ids
from atom_kernels import envs

log = logging.getLogger(__name__)
# Bump when the conversion's output changes: older cached checkpoints are then converted again.
CONVERTER_VERSION = 1
_SHARD_BYTES = 2 << 30


def cache_root() -> Path:
    """$ATOM_CACHE_DIR, default ~/.cache/atom-core: where converted and demo checkpoints are kept."""
    return envs.ATOM_CACHE_DIR


def find_gguf(model: str | os.PathLike) -> Path | None:
    """The GGUF file `model` names: a *.gguf file, or a directory without config.json holding exactly one."""
    p = Path(model)
    if p.is_file() and p.suffix == ".gguf":
        return p
    if p.is_dir() and not (p / "config.json").is_file():
        files = sorted(p.glob("*.gguf"))
        if len(files) > 1:
            raise ValueError(f"{p} holds {len(files)} GGUF files ({', '.join(f.name for f in files)}): pass the "
                             "path of the one to load")
        return files[0] if files else None
    return None


def converted_dir(gguf_path: str | os.PathLike) -> Path:
    """The cache directory of a GGUF file: keyed by its absolute path, size and modification time."""
    p = Path(gguf_path).resolve()
    st = p.stat()
    key = f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0{CONVERTER_VERSION}"
    return cache_root() / "gguf" / f"{p.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def convert_gguf(gguf_path: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Convert `gguf_path` into an HF checkpoint directory (default: its cache directory) unless done already."""
    out = Path(out) if out is not None else converted_dir(gguf_path)
    if (out / "config.json").is_file():
        return out
    f = GGUFFile(gguf_path)
    hf_architecture(f)  # unsupported architecture: fail before any work
    counts = check_tensor_types(f)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        cfg = hf_config(f)
        _save_weights(f, cfg, tmp)
        save_tokenizer(f, tmp)
        (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": stop_token_ids(f)}))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))  # last: its presence marks a whole conversion
        (tmp / "SOURCE.txt").write_text(f"converted by atom-core from {Path(gguf_path).resolve()}\n"
                                        f"tensor types: {counts}\n")
        if out.exists():  # another process converted it meanwhile
            shutil.rmtree(tmp)
        else:
            tmp.replace(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("converted %s (%s) to an HF checkpoint in %s", gguf_path, _type_summary(counts), out)
    return out


def _type_summary(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _save_weights(f: GGUFFile, cfg: dict, out: Path) -> None:
    """float32 safetensors shards of at most ~2 GiB (+ an index when there are several)."""
    _, _, permuted = hf_architecture(f)
    qk = (cfg["num_attention_heads"], cfg["num_key_value_heads"]) if permuted else None
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in hf_tensors(f, qk):
        if size and size + tensor.nbytes > _SHARD_BYTES:
            _write_shard(shards, out)
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += tensor.nbytes
    _write_shard(shards, out)
    if len(shards) == 1:
        (out / "model-00001.safetensors").rename(out / "model.safetensors")
        return
    weight_map = {name: f"model-{i + 1:05d}.safetensors" for i, shard in enumerate(shards) for name in shard}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _write_shard(shards: list[dict[str, torch.Tensor]], out: Path) -> None:
    """Write the last shard and drop its tensors (keep the names for the index)."""
    save_file(shards[-1], str(out / f"model-{len(shards):05d}.safetensors"), metadata={"format": "pt"})
    shards[-1] = dict.fromkeys(shards[-1])
