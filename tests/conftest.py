"""Shared fixtures: tiny random-weight HF checkpoints saved to disk and loaded the real way."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    """make(arch, **config_overrides) → path of a saved checkpoint (cached per arguments)."""
    from atom_frontends.native.demo import build_checkpoint

    cache: dict = {}

    def make(arch: str = "Qwen3ForCausalLM", seed: int = 0, **overrides):
        key = (arch, seed, repr(sorted(overrides.items())))
        if key not in cache:
            path = tmp_path_factory.mktemp(arch)
            cache[key] = build_checkpoint(path, arch, seed=seed, **overrides)
        return cache[key]

    return make
