"""`atom-core serve` without its optional dependencies: a clear error naming the extra, exit status 2."""

from __future__ import annotations

import sys

from atom_frontends.native.cli import main


def test_serve_without_fastapi_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` now raises ImportError
    assert main(["serve", "--model", str(tmp_path)]) == 2
    assert "pip install 'atom-core[serve]'" in capsys.readouterr().err


def test_serve_with_a_bad_engine_argument_says_which(capsys, checkpoint_factory):
    """The engine process fails to load the model: its error reaches the user as the offline engine's would."""
    path = checkpoint_factory("Qwen3ForCausalLM")
    assert main(["serve", "--model", str(path), "--max-model-len", "100000"]) == 2
    err = capsys.readouterr().err
    assert "max_model_len=100000 exceeds the checkpoint's max_position_embeddings" in err, err
