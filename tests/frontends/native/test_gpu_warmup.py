"""No Triton compilation inside serving steps on the GPU: the native engine warms its attention and MoE kernels
at start-up (atom_core.layers.kernel_warmup), so prompts of any length, chunked prefills, prefix-cache hits and
long decodes meet only compiled variants, with CUDA graphs for every step and with steps that carry prompt tokens
run eagerly. Each run is a fresh process (Triton's in-process cache would hide a miss); the canary skips the warm-up
with eager prompt steps and must see compilations (with every step a graph, capture compiles each variant itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[3]


def _compiles(path, tmp_path, *flags: str) -> dict:
    # A fresh Triton disk cache: a variant first met mid-serving then costs a real compile, as on a new machine.
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    proc = subprocess.run([sys.executable, "-m", "tests.frontends.native.jit_after_warmup", str(path), *flags],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "DeepseekV3ForCausalLM"])
def test_no_compilation_after_warm_up(checkpoint_factory, tmp_path, arch):
    path = checkpoint_factory(arch, max_position_embeddings=2048)
    assert _compiles(path, tmp_path / "canary", "--no-warmup", "--decode-graphs-only")["compiles"] > 0, \
        "without warm-up the eager serving steps compiled nothing: the check cannot fail"
    for flags in ((), ("--decode-graphs-only",)):
        result = _compiles(path, tmp_path / "-".join(("warm", *flags)), *flags)
        assert result["compiles"] == 0, f"Triton compiled {result} inside serving steps after the warm-up ({flags})"
