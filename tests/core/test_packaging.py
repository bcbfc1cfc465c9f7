"""pyproject's explicit package list covers every package folder of the tree."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"atom_core": "atom_core", "atom_kernels": "atom_kernels", "frontends": "atom_frontends"}


def test_every_package_folder_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found == set(cfg["packages"])
    assert cfg["package-dir"] == {"atom_core": "atom_core", "atom_kernels": "atom_kernels",
                                  "atom_frontends": "frontends"}
