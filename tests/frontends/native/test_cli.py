"""The `atom-core` command line, run as a user would (a subprocess of the installed script)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def _run(args, tmp_path):
    exe = shutil.which("atom-core") or os.path.join(os.path.dirname(sys.executable), "atom-core")
    env = dict(os.environ, ATOM_CACHE_DIR=str(tmp_path))
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=300)


def test_generate_with_builtin_demo_checkpoint(tmp_path):
    r = _run(["generate", "--prompt", "Hello", "--prompt", "Bonjour à tous", "--max-tokens", "5"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "DEMO checkpoint: random weights" in r.stderr
    assert r.stdout.count("--- prompt:") == 2 and "tokens: 5" in r.stdout
    assert (tmp_path / "demo-qwen3-random-v1" / "config.json").is_file()
    again = _run(["generate", "--prompt", "Hello", "--max-tokens", "5"], tmp_path)  # cached: same output
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
    r = _run(["info"], tmp_path)
    assert r.returncode == 0, r.stderr
    for words in ("host:        native", "paged_attention  torch", "LlamaForCausalLM, Qwen3ForCausalLM",
                  "transformers"):
        assert words in r.stdout
