"""Sampling inside the decode CUDA graphs (sample_tokens' Triton kernel): what test_graph_sampling.py checks on a CPU
with the graphs replayed eagerly, here with real graphs on a GPU, fp32 (transformers' fp32 logits are the oracle):
- a temperature batch decodes in graph steps with no CPU sampling (sampler.sample spied), its tokens follow
  softmax(logits / t) (chi-square and likelihood z), and the canary (twice the temperature inside the op) fails;
- greedy and temperature rows in the same graph steps: the greedy rows keep transformers' greedy tokens;
- the same engine seed reproduces the tokens; a seeded request gives the same tokens alone and in a batch of
  unseeded ones (the CPU samples it from its own generator);
- bf16: the graph path runs and nothing is sampled by the CPU.
"""

from __future__ import annotations

import pytest
import torch

from atom_frontends.native import SamplingParams
from tests.broken_ops import broken
from tests.frontends.native.graph_sampling import (
    PROMPTS,
    Z_LIMIT,
    check_engine_seed_reproduces_draws,
    check_greedy_rows_beside_temperature_rows,
    cpu_sampling_steps,
    decode,
    distribution_stats,
)
from tests.frontends.native.test_gpu_parity import native

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def ieee_fp32():
    torch.backends.cuda.matmul.allow_tf32 = False


@pytest.fixture(scope="module")
def path(checkpoint_factory):
    return checkpoint_factory("Qwen3ForCausalLM", num_hidden_layers=1)


def engine(path, dtype="float32", seed=0, overlap=True):
    return native(path, dtype, False, max_num_seqs=64, seed=seed, overlap_scheduling=overlap)


@pytest.mark.parametrize("overlap, temperature", [(True, 1.0), (False, 0.7)], ids=["overlap", "no-overlap"])
def test_temperature_batch_samples_in_graph_steps_with_the_right_distribution(path, monkeypatch, overlap, temperature):
    cpu = cpu_sampling_steps(monkeypatch)
    llm = engine(path, overlap=overlap)
    outs = decode(llm, temperature)
    assert llm.engine.runner.graphs.replays > 0
    assert not any(cpu), "the CPU sampled in a graph step"  # prefill steps are graph steps too: no CPU sampling
    chi2, threshold, z = distribution_stats(path, outs, temperature, "cuda")
    assert chi2 < threshold and abs(z) < Z_LIMIT, (chi2, threshold, z)


def test_canary_wrong_temperature_in_the_graph_is_caught(path):
    with broken("sample_temperature", "cuda"):
        llm = engine(path)
        outs = decode(llm, 1.0)
    assert llm.engine.runner.graphs.replays > 0
    chi2, threshold, z = distribution_stats(path, outs, 1.0, "cuda")
    assert z < -2 * Z_LIMIT, (chi2, threshold, z)  # too hot: the drawn tokens far less likely than they should be


def test_greedy_rows_beside_temperature_rows_keep_hf_greedy_tokens(path, monkeypatch):
    cpu = cpu_sampling_steps(monkeypatch)
    check_greedy_rows_beside_temperature_rows(engine(path), path, "cuda", cpu)


def test_engine_seed_reproduces_graph_draws(path):
    check_engine_seed_reproduces_draws(lambda seed: engine(path, seed=seed))


def test_seeded_request_alone_and_in_a_batch(path, monkeypatch):
    cpu = cpu_sampling_steps(monkeypatch)
    llm = engine(path)
    seeded = SamplingParams(temperature=1.0, max_tokens=16, seed=42, ignore_eos=True)
    alone = llm.generate(PROMPTS[3:4], seeded, use_tqdm=False)[0].outputs[0].token_ids
    assert llm.engine.runner.graphs.replays > 0 and any(cpu)  # graph steps whose token the CPU sampled
    plain = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    batch = llm.generate(PROMPTS[:8], [plain] * 3 + [seeded] + [plain] * 4, use_tqdm=False)
    assert batch[3].outputs[0].token_ids == alone


def test_bf16_temperature_batch_runs_in_graph_steps(path, monkeypatch):
    cpu = cpu_sampling_steps(monkeypatch)
    llm = engine(path, dtype="bfloat16")
    outs = decode(llm, 1.0)
    assert llm.engine.runner.graphs.replays > 0 and not any(cpu)
    assert all(len(o) == len(outs[0]) for o in outs) and len({tuple(o) for o in outs}) > len(outs) // 2
