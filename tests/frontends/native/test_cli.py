"""The `atom-core` command line, run as a user would (a subprocess of the installed script)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


def _run(args, tmp_path):
    exe = shutil.which("atom-core") or os.path.join(os.path.dirname(sys.executable), "atom-core")
    env = dict(os.environ, ATOM_CACHE_DIR=str(tmp_path))
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=300)


def test_generate_with_builtin_demo_checkpoint(tmp_path):
    r = _run(["generate", "--demo", "--prompt", "Hello", "--prompt", "Bonjour à tous", "--max-tokens", "5"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "DEMO checkpoint: random weights" in r.stderr
    assert r.stdout.count("--- prompt:") == 2 and "tokens: 5" in r.stdout
    assert (tmp_path / "demo-qwen3-random-v2" / "config.json").is_file()
    again = _run(["generate", "--demo", "--prompt", "Hello", "--max-tokens", "5"], tmp_path)  # cached: same output
    assert again.stdout.splitlines()[:2] == r.stdout.splitlines()[:2]


def test_generate_with_model_and_sampling(checkpoint_factory, tmp_path):
    path = checkpoint_factory("LlamaForCausalLM")
    r = _run(["generate", "--model", str(path), "--prompt", "abc", "--temperature", "0.7", "--max-tokens", "4"],
             tmp_path)
    assert r.returncode == 0, r.stderr
    assert "tokens: 4" in r.stdout or "finish_reason: stop" in r.stdout


def test_generate_bad_input_exits_2(tmp_path):
    r = _run(["generate", "--model", str(tmp_path / "missing")], tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = _run(["generate", "--temperature", "-1"], tmp_path)
    assert r.returncode == 2 and "temperature must be >= 0" in r.stderr


def test_info(tmp_path):
    import atom_kernels
    from atom_core.platform import default_device

    r = _run(["info"], tmp_path)
    assert r.returncode == 0, r.stderr
    backends = atom_kernels.dispatch.describe(default_device().type)  # triton on a GPU, torch on a CPU
    for words in ("host:        native", f"paged_attention  {backends['paged_attention']}",
                  "LlamaForCausalLM, Qwen3ForCausalLM", "transformers"):
        assert words in r.stdout


def _outputs(r) -> list[str]:
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if line.lstrip().startswith("output:")]


SAMPLE = ["generate", "--demo", "--prompt", "Once", "--prompt", "upon a time", "--temperature", "1.0",
          "--max-tokens", "24"]


@pytest.mark.slow
def test_seed(tmp_path):
    """No --seed: a new sample each run (the demo model's next-token distribution is near-uniform over 320
    tokens, so two 2x24-token samples coincide with probability ~0); the same --seed: the same output."""
    first, second = _outputs(_run(SAMPLE, tmp_path)), _outputs(_run(SAMPLE, tmp_path))
    assert len(first) == 2 and first != second
    seeded = [_outputs(_run([*SAMPLE, "--seed", "7"], tmp_path)) for _ in range(2)]
    assert seeded[0] == seeded[1]
    assert seeded[0] != _outputs(_run([*SAMPLE, "--seed", "8"], tmp_path))


@pytest.mark.slow
def test_max_model_len_kv_cache_memory_and_dtype_flags(tmp_path):
    r = _run(["generate", "--demo", "--prompt", "Hi", "--max-tokens", "2", "--max-model-len", "64"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "max_model_len=64" in r.stderr  # the one KV cache line
    r = _run(["generate", "--demo", "--prompt", "x" * 70, "--max-model-len", "64"], tmp_path)
    assert r.returncode == 2 and "max_model_len=64 leaves no room" in r.stderr
    # The demo model's 4 layers x 2 KV heads x 32 dims in float32: 32 KiB per 16-token block, 1 MiB = 512 tokens.
    r = _run(["generate", "--demo", "--prompt", "Hi", "--max-tokens", "2", "--kv-cache-memory", "1MiB",
              "--enforce-eager", "--dtype", "float32"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "max_model_len=512, lowered from the checkpoint's 2048 as the KV cache holds 512 tokens" in r.stderr
    r = _run(["generate", "--demo", "--kv-cache-memory", "1MiB", "--max-model-len", "1024"], tmp_path)
    assert r.returncode == 2 and "fewer than max_model_len=1024" in r.stderr
    # an fp8 cache: 1 byte per value instead of 4, so the same memory holds 4x the tokens
    r = _run(["generate", "--demo", "--prompt", "Hi", "--max-tokens", "2", "--kv-cache-memory", "256KiB",
              "--enforce-eager", "--dtype", "float32", "--kv-cache-dtype", "fp8"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "max_model_len=512, lowered from the checkpoint's 2048 as the KV cache holds 512 tokens" in r.stderr
    r = _run(["generate", "--demo", "--kv-cache-dtype", "fp8_e5m2"], tmp_path)
    assert r.returncode == 2 and "kv_cache_dtype='fp8_e5m2' is not supported" in r.stderr, r.stderr


@pytest.mark.parametrize("flag, value, words", [
    ("--max-model-len", "0", "'0' is not a positive integer"),
    ("--max-model-len", "1e3", "'1e3' is not a positive integer"),
    ("--kv-cache-memory", "4XB", "'4XB' is not a size: give bytes, or e.g. 4GiB, 512MiB"),
    ("--kv-cache-memory", "0", "'0' is not a size"),
    ("--dtype", "fp8", "unknown dtype 'fp8'"),
    ("--seed", "abc", "invalid int value: 'abc'"),
    ("--max-num-batched-tokens", "0", "'0' is not a positive integer"),
])
def test_bad_flag_values_exit_2(tmp_path, flag, value, words):
    r = _run(["generate", flag, value], tmp_path)
    assert r.returncode == 2 and f"argument {flag}: {words}" in r.stderr, r.stderr


@pytest.mark.parametrize("text, expected", [
    ("4096", 4096), ("4GiB", 4 << 30), ("512 MiB", 512 << 20), ("1.5GiB", 3 << 29), ("8GB", 8 * 10**9),
    ("2kib", 2048),
])
def test_kv_cache_memory_sizes(text, expected):
    from atom_frontends.native.cli import build_parser

    assert build_parser().parse_args(["generate", "--kv-cache-memory", text]).kv_cache_memory == expected


def test_default_step_budget_follows_the_device(monkeypatch):
    """max_num_batched_tokens unset: 2048 on CPU and on GPUs under 70 GiB, 8192 on larger ones (vLLM's server
    default); 0 is refused, not taken for unset."""
    from types import SimpleNamespace

    import torch

    from atom_frontends.native.engine_args import EngineArgs, default_max_num_batched_tokens

    assert default_max_num_batched_tokens(torch.device("cpu")) == 2048
    for gib, want in ((141, 8192), (80, 8192), (48, 2048), (24, 2048)):
        props = SimpleNamespace(total_memory=gib << 30)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _device, p=props: p)
        assert default_max_num_batched_tokens(torch.device("cuda", 0)) == want
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineArgs(model="unused", max_num_batched_tokens=0)


def test_max_num_batched_tokens_reaches_the_engine(tmp_path):
    """--max-num-batched-tokens sets the step budget of generate / chat / serve's engine (unset: EngineArgs'); a
    16-token budget chunks a longer prompt and greedy output is the same as unchunked."""
    from atom_frontends.native.cli import build_parser, engine_kwargs
    from atom_frontends.native.engine_args import EngineArgs

    for command in ("generate", "chat", "serve"):
        args = build_parser().parse_args([command, "--max-num-batched-tokens", "48"])
        assert engine_kwargs(args)["max_num_batched_tokens"] == 48
    assert "max_num_batched_tokens" not in engine_kwargs(build_parser().parse_args(["generate"]))
    assert EngineArgs.max_num_batched_tokens is None  # default_max_num_batched_tokens: the help text's default
    prompt = ["generate", "--demo", "--prompt", "a longer prompt than sixteen tokens " * 3, "--max-tokens", "6",
              "--dtype", "float32", "--no-chat"]
    chunked = _outputs(_run([*prompt, "--max-num-batched-tokens", "16"], tmp_path))
    assert chunked == _outputs(_run(prompt, tmp_path)) and len(chunked) == 1
