"""`atom-core serve` without its optional dependencies: a clear error naming the extra, exit status 2."""

from __future__ import annotations

import sys

from atom_frontends.native.cli import main


def test_serve_without_fastapi_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` now raises ImportError
    assert main(["serve", "--model", str(tmp_path)]) == 2
    assert "pip install 'atom-core[serve]'" in capsys.readouterr().err
