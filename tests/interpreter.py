"""Running checks under Triton's CPU interpreter: a fresh Python process (TRITON_INTERPRET is read when triton is
imported), from the repo root, skipped where the interpreter cannot run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_under_interpreter(code: str, done_marker: str, **env: str) -> None:
    """Run `code` with TRITON_INTERPRET=1 (and `env`); fail unless it exits 0 having printed `done_marker`. The
    interpreter of triton 3.6 cannot run loops with runtime bounds under numpy >= 2.4: skipped there."""
    np = pytest.importorskip("numpy")
    if tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 4):
        pytest.skip(f"triton's interpreter fails on runtime loop bounds with numpy {np.__version__} (< 2.4 works)")
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="1", **env), cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    assert done_marker in done.stdout
