"""GGUF files atom-core cannot load give errors that name the file, the problem and what to do."""

from __future__ import annotations

import shutil

import pytest

from atom_core.gguf import convert_gguf, find_gguf, resolve_checkpoint
from tests.gguf_files import write_gguf


@pytest.fixture(scope="module")
def llama_gguf(checkpoint_factory, tmp_path_factory):
    from transformers import AutoConfig

    ckpt = checkpoint_factory("LlamaForCausalLM")
    return write_gguf(tmp_path_factory.mktemp("gguf") / "llama.gguf", ckpt, AutoConfig.from_pretrained(ckpt))


def _copy(src, tmp_path, cut: int = 0):
    data = src.read_bytes()
    dst = tmp_path / "m.gguf"
    dst.write_bytes(data[: len(data) - cut])
    return dst


def test_converts_once_and_resolves_a_gguf_file_or_its_directory(llama_gguf, tmp_path, monkeypatch, caplog):
    import json
    import logging

    monkeypatch.setenv("ATOM_CACHE_DIR", str(tmp_path / "cache"))
    src = _copy(llama_gguf, tmp_path)
    with caplog.at_level(logging.INFO, logger="atom_core.gguf"):
        out = resolve_checkpoint(str(src), "bfloat16")
    assert out.startswith(str(tmp_path / "cache" / "gguf"))
    assert "m.gguf: weights dequantized to bfloat16 at load" in caplog.text
    assert resolve_checkpoint(str(tmp_path)) == out  # the directory holding it; converted once (cached)
    cfg = json.loads((tmp_path / "cache" / "gguf" / out.rsplit("/", 1)[1] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 2
    hf_dir = str(llama_gguf.parent.parent)
    assert resolve_checkpoint(hf_dir) == hf_dir  # not a GGUF: unchanged


def test_truncated_file(llama_gguf, tmp_path):
    with pytest.raises(ValueError, match=r"m\.gguf is truncated: its tensors need more data than the file's \d+ "):
        convert_gguf(_copy(llama_gguf, tmp_path, cut=1000), tmp_path / "out")
    with pytest.raises(ValueError, match=r"m\.gguf is not a readable GGUF file \(corrupt or truncated\?\)"):
        convert_gguf(_copy(llama_gguf, tmp_path, cut=llama_gguf.stat().st_size - 100), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_corrupt_file(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ValueError, match=r"x\.gguf is not a readable GGUF file .*magic"):
        convert_gguf(bad, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")


def test_unsupported_tensor_type(checkpoint_factory, tmp_path):
    import gguf
    from transformers import AutoConfig

    ckpt = checkpoint_factory("LlamaForCausalLM")
    path = write_gguf(tmp_path / "q81.gguf", ckpt, AutoConfig.from_pretrained(ckpt),
                      tensor_type={"blk.1.ffn_up.weight": gguf.GGMLQuantizationType.Q8_1})
    with pytest.raises(ValueError, match=r"cannot dequantize: blk\.1\.ffn_up\.weight \(Q8_1\)"):
        convert_gguf(path, tmp_path / "out")


def test_unsupported_architecture(checkpoint_factory, tmp_path):
    from transformers import AutoConfig

    ckpt = checkpoint_factory("LlamaForCausalLM")
    path = write_gguf(tmp_path / "g.gguf", ckpt, AutoConfig.from_pretrained(ckpt), arch="gemma")
    with pytest.raises(ValueError, match=r"GGUF architecture 'gemma' is not supported; atom-core reads GGUFs of: "
                                         r"llama, qwen3"):
        convert_gguf(path, tmp_path / "out")


def test_directory_with_two_ggufs(llama_gguf, tmp_path):
    shutil.copy(llama_gguf, tmp_path / "a.gguf")
    shutil.copy(llama_gguf, tmp_path / "b.gguf")
    with pytest.raises(ValueError, match="holds 2 GGUF files .*a.gguf, b.gguf.*pass the path"):
        find_gguf(tmp_path)
