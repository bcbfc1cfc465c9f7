"""A decode step on GPU never synchronizes the stream or the device: its one wait is on the event recorded after
its sampled tokens' non-blocking copy to the CPU (StepOutput.results), with overlap scheduling placed after the
next step is launched."""

from __future__ import annotations

import linecache
import warnings

import pytest
import torch

from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import random_prompts

pytestmark = pytest.mark.gpu


def _sync_sites(fn) -> list[str]:
    """The source lines that made torch synchronize with the device while fn() ran."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return [f"{w.filename.rsplit('/', 1)[-1]}: {linecache.getline(w.filename, w.lineno).strip()}"
            for w in caught if "synchroniz" in str(w.message)]


def sync_sites_per_step(llm: LLM, steps: int, temperature: float = 0.0) -> list[list[str]]:
    """For each decode step, the source lines that made torch synchronize with the device."""
    engine = llm.engine
    for p in random_prompts([20, 7, 33], seed=14):
        engine.add_request(p, SamplingParams(temperature=temperature, max_tokens=64, ignore_eos=True))
    engine.step()  # the prefill step (one chunk each)
    assert all(r.num_computed_tokens == r.num_tokens + r.num_pending - 1 for r in engine.scheduler.running)
    return [_sync_sites(engine.step) for _ in range(steps)]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decode_step_does_not_sync(checkpoint_factory, enforce_eager, dtype, overlap, temperature):
    assert _sync_sites(lambda: torch.ones(2, device="cuda").tolist())  # the detector sees a blocking read
    path = checkpoint_factory("Qwen3ForCausalLM")
    llm = LLM(path, dtype=dtype, num_kv_blocks=256, max_num_seqs=4, enforce_eager=enforce_eager,
              overlap_scheduling=overlap)
    assert (llm.engine.runner.graphs is None) == enforce_eager and llm.engine.overlap == overlap
    for sites in sync_sites_per_step(llm, steps=5, temperature=temperature):
        assert not sites, sites
    outs = {r.request_id: len(r.output_token_ids) for r in llm.engine.scheduler.running}
    assert set(outs.values()) == {6 if not overlap else 5}  # the steps did sample: prefill + 5 decodes
