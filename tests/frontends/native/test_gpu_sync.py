"""A decode step on GPU waits for the device once: when it reads the sampled tokens."""

from __future__ import annotations

import linecache
import warnings

import pytest
import torch

from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import random_prompts

pytestmark = pytest.mark.gpu


def sync_sites_per_step(llm: LLM, steps: int) -> list[list[str]]:
    """For each decode step, the source lines that made torch synchronize with the device."""
    engine = llm.engine
    for p in random_prompts([20, 7, 33], seed=14):
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    engine.step()  # the prefill step (one chunk each)
    assert all(r.num_computed_tokens == r.num_tokens - 1 for r in engine.scheduler.running)
    counts = []
    for _ in range(steps):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                engine.step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        counts.append([f"{w.filename.rsplit('/', 1)[-1]}: {linecache.getline(w.filename, w.lineno).strip()}"
                       for w in caught if "synchroniz" in str(w.message)])
    return counts


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decode_step_syncs_only_to_read_tokens(checkpoint_factory, enforce_eager, dtype):
    path = checkpoint_factory("Qwen3ForCausalLM")
    llm = LLM(path, dtype=dtype, num_kv_blocks=256, max_num_seqs=4, enforce_eager=enforce_eager)
    assert (llm.engine.runner.graphs is None) == enforce_eager
    for sites in sync_sites_per_step(llm, steps=5):
        assert sites and all(s.startswith("sampler.py") and ".tolist()" in s for s in sites), sites
