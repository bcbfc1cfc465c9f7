"""Sampling inside graph steps, on a CPU: the runner's graphs replaced by eager_graphs (the same padded step on
the same staged buffers, run eagerly), so the choice of graph sampling, the staging of temperatures and Philox keys
and the sample_tokens op (its torch reference here) run as on a GPU. test_gpu_graph_sampling.py: real CUDA graphs.
- a temperature-1 batch decodes in graph steps with no CPU sampling, and its tokens follow softmax(logits / t)
  (transformers' logits); the canary doubles the temperature inside the op and expects the check to fail;
- greedy rows beside temperature rows in the same graph steps keep transformers' greedy tokens;
- the same engine seed reproduces the tokens, another seed does not;
- what the graph cannot do (top-p, a per-request seed, penalties, logprobs, min_tokens) is sampled by the CPU.
"""

from __future__ import annotations

import pytest
import torch

from atom_frontends.native import LLM, SamplingParams
from atom_frontends.native.request import Request
from atom_frontends.native.sampler import graph_sample_suffices
from tests.broken_ops import broken
from tests.frontends.native.graph_sampling import (
    PROMPTS,
    Z_LIMIT,
    check_engine_seed_reproduces_draws,
    check_greedy_rows_beside_temperature_rows,
    cpu_sampling_steps,
    decode,
    distribution_stats,
    eager_graphs,
)


def engine(path, seed=0, overlap=False) -> LLM:
    llm = LLM(path, num_kv_blocks=256, block_size=16, max_num_seqs=64, seed=seed, overlap_scheduling=overlap)
    runner = llm.engine.runner
    assert runner.graphs is None  # a CPU: no CUDA graphs, the same steps replayed eagerly stand in
    runner.graphs = eager_graphs(runner)
    return llm


@pytest.fixture(scope="module")
def path(checkpoint_factory):
    return checkpoint_factory("Qwen3ForCausalLM", num_hidden_layers=1)


@pytest.mark.parametrize("overlap, temperature", [(False, 1.0), (True, 0.7)], ids=["no-overlap", "overlap"])
def test_temperature_batch_samples_in_graph_steps_with_the_right_distribution(path, monkeypatch, overlap, temperature):
    cpu = cpu_sampling_steps(monkeypatch)
    llm = engine(path, overlap=overlap)
    outs = decode(llm, temperature)
    assert llm.engine.runner.graphs.replays > 0
    assert not any(cpu), "the CPU sampled in a graph step"  # prefill steps are graph steps too: no CPU sampling
    chi2, threshold, z = distribution_stats(path, outs, temperature, "cpu")
    assert chi2 < threshold and abs(z) < Z_LIMIT, (chi2, threshold, z)


def test_canary_wrong_temperature_in_the_graph_is_caught(path):
    with broken("sample_temperature", "cpu"):
        outs = decode(engine(path), 1.0)
    chi2, threshold, z = distribution_stats(path, outs, 1.0, "cpu")
    assert z < -2 * Z_LIMIT, (chi2, threshold, z)  # too hot: the drawn tokens far less likely than they should be


def test_greedy_rows_beside_temperature_rows_keep_hf_greedy_tokens(path, monkeypatch):
    cpu = cpu_sampling_steps(monkeypatch)
    check_greedy_rows_beside_temperature_rows(engine(path), path, "cpu", cpu)


def test_engine_seed_reproduces_graph_draws(path):
    check_engine_seed_reproduces_draws(lambda seed: engine(path, seed=seed))


def test_seeded_request_is_sampled_by_the_cpu_and_batch_independent(path, monkeypatch):
    cpu = cpu_sampling_steps(monkeypatch)
    llm = engine(path)
    seeded = SamplingParams(temperature=1.0, max_tokens=16, seed=42, ignore_eos=True)
    alone = llm.generate(PROMPTS[3:4], seeded, use_tqdm=False)[0].outputs[0].token_ids
    assert cpu and all(cpu)  # its steps (prefill and decodes) ran as graphs and the CPU sampled
    plain = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    batch = llm.generate(PROMPTS[:8], [plain] * 3 + [seeded] + [plain] * 4, use_tqdm=False)
    assert batch[3].outputs[0].token_ids == alone


def _request(**params) -> Request:
    return Request("r", None, [1, 2, 3], SamplingParams(**params), eos_token_ids=frozenset({2}))


@pytest.mark.parametrize("params, graph", [
    (dict(temperature=0), True),
    (dict(temperature=0.7), True),
    (dict(temperature=0, top_p=0.5, top_k=3, min_p=0.1), True),  # greedy: the filters change nothing
    (dict(temperature=0.7, top_p=0.9), False),
    (dict(temperature=0.7, top_k=5), False),
    (dict(temperature=0.7, min_p=0.1), False),
    (dict(temperature=0.7, repetition_penalty=1.2), False),
    (dict(temperature=0, presence_penalty=0.5), False),
    (dict(temperature=0.7, logprobs=1), False),
    (dict(temperature=0.7, min_tokens=4, max_tokens=8), False),
])
def test_graph_sample_suffices(params, graph):
    assert graph_sample_suffices([_request(temperature=0), _request(**params)]) is graph


def test_a_per_request_seed_is_not_sampled_in_the_graph():
    req = _request(temperature=0.7, seed=3)
    req.generator = torch.Generator().manual_seed(3)
    assert not graph_sample_suffices([req])
