"""A real `atom-core serve` subprocess on 127.0.0.1 for the serve tests: started on a free port, ready once
/health answers, always stopped (SIGTERM, then SIGKILL) within bounded times."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

START_TIMEOUT = 120.0  # loading torch + transformers + the model on a busy 2-core machine
STOP_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    def __init__(self, model, *args: str, name: str = "tiny") -> None:
        exe = shutil.which("atom-core") or os.path.join(os.path.dirname(sys.executable), "atom-core")
        self.port, self.name = _free_port(), name
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile(mode="w+")
        cmd = [exe, "serve", "--model", str(model), "--port", str(self.port), "--served-model-name", name,
               "--disable-uvicorn-access-log", *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"atom-core serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if self.request("GET", "/health", timeout=2)[0] == 200:
                    return
            except OSError:  # not listening yet
                pass
            time.sleep(0.2)
        raise TimeoutError(f"atom-core serve not ready within {START_TIMEOUT} s:\n{self.output()}")

    def client(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=120, **kwargs)

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 60) -> tuple[int, str]:
        """(HTTP status, body text) of a raw request (stdlib only: what the openai client cannot send)."""
        req = urllib.request.Request(self.url + path, data=body, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stats(self) -> dict:
        return json.loads(self.request("GET", "/stats")[1])

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and wait; the exit code (raises subprocess.TimeoutExpired past `timeout`)."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.terminate()
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)
        self.log.close()
