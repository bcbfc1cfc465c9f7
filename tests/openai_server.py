"""Start a host's own OpenAI-compatible server in a subprocess, wait for /health, stop it; and ask it for greedy
chat completions with the real `openai` client."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(cmd: list[str], port: int, log_dir: Path, env: dict | None = None, timeout: float = 900) -> Iterator[str]:
    """Run `cmd` until the block ends; yields the base URL once GET /health answers 200."""
    log_path = log_dir / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                                cwd=log_dir)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{' '.join(cmd[:4])} did not come up (exit {proc.returncode}):\n"
                                     f"{log_path.read_text()[-4000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def greedy_chats(base_url: str, model: str, chats: list[list[dict]], max_tokens: int) -> list[str]:
    """Each chat's greedy answer text (EOS ignored, as the reference ran), through the `openai` client."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none")
    texts = []
    for messages in chats:
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                           extra_body={"ignore_eos": True, "skip_special_tokens": True})
        assert r.usage.completion_tokens == max_tokens, r.usage
        texts.append(r.choices[0].message.content)
    return texts
