"""Configuration is read in one module: atom_kernels/envs.py reads the environment, nothing else in the library
does, every variable the library reads through it is declared there, and its parsers name the variable on bad
input."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from atom_kernels import envs

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("atom_core", "atom_kernels", "frontends")
ENVS_FILE = ROOT / "atom_kernels" / "envs.py"


def library_files():
    return [p for folder in LIBRARY for p in sorted((ROOT / folder).rglob("*.py"))]


def test_only_the_envs_module_reads_the_environment():
    readers = [str(p.relative_to(ROOT)) for p in library_files()
               if p != ENVS_FILE and re.search(r"os\.environ|getenv", p.read_text())]
    assert readers == []


def test_every_variable_read_is_declared_with_a_meaning():
    used = set()
    for path in library_files():
        tree = ast.parse(path.read_text())
        # files reading atom_kernels.envs (a host's own envs module, e.g. vllm.envs, is the host's business)
        ours = any(isinstance(n, ast.ImportFrom) and n.module == "atom_kernels"
                   and any(a.name == "envs" for a in n.names) for n in ast.walk(tree))
        for node in ast.walk(tree) if ours else ():
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "envs":
                used.add(node.attr)
    assert used and used <= set(envs.VARIABLES), used - set(envs.VARIABLES)
    assert all(v.meaning for v in envs.VARIABLES.values())
    with pytest.raises(AttributeError, match="no variable 'ATOM_NOPE'"):
        envs.ATOM_NOPE  # noqa: B018


def test_values_are_parsed_at_access_and_bad_ones_named(monkeypatch):
    monkeypatch.delenv("ATOM_PDL", raising=False)
    assert envs.ATOM_PDL is True  # the default
    for text, value in (("0", False), ("off", False), ("YES", True), ("1", True)):
        monkeypatch.setenv("ATOM_PDL", text)
        assert envs.ATOM_PDL is value
    monkeypatch.setenv("ATOM_PDL", "sometimes")
    with pytest.raises(ValueError, match="ATOM_PDL='sometimes': use 1/0"):
        envs.ATOM_PDL  # noqa: B018
    monkeypatch.setenv("ATOM_FRONTENDS", " native, vllm ,")
    assert envs.ATOM_FRONTENDS == {"native", "vllm"}
    monkeypatch.setenv("ATOM_FRONTENDS", " ")
    assert envs.ATOM_FRONTENDS is None
