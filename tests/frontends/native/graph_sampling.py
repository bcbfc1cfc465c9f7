"""Checks of sampling inside decode graph steps, shared by the CPU tests (graphs replayed eagerly: eager_graphs) and
the GPU tests (real CUDA graphs): which steps the CPU sampled in, and whether the decoded tokens follow the model's
softmax(logits / t), measured against transformers' logits on the same checkpoint: a chi-square of the token counts
and a z-score of their log-likelihood (the one that sees a wrong temperature best)."""

from __future__ import annotations

import math

import torch

from atom_frontends.native import LLM, SamplingParams
from atom_frontends.native import model_runner as model_runner_module
from atom_frontends.native.cuda_graphs import StepGraphs
from tests.frontends.native import hf_oracle

PROMPTS = hf_oracle.random_prompts([5, 8, 6, 9, 7, 10, 4, 8] * 8, seed=91)  # 64 requests
NEW = 24


def eager_graphs(runner) -> StepGraphs:
    """The runner's graphs on a CPU: StepGraphs(capture=False), whose every replay runs the runner's graph step on
    the padded inputs staged for it, as a replay does (no CUDA graph: the runner's staging and in-graph sampling
    run as they do on a GPU)."""
    return runner.step_graphs(capture=False)


def cpu_sampling_steps(monkeypatch) -> list[bool]:
    """Spy: one entry per sampler.sample call made by the runner, True when the step ran as a graph."""
    calls, in_graph = [], [False]
    execute, sample = model_runner_module.ModelRunner.execute, model_runner_module.sample

    def spy_execute(self, batch):
        in_graph[0] = self.graph_shape(batch) is not None
        return execute(self, batch)

    def spy_sample(*args, **kwargs):
        calls.append(in_graph[0])
        return sample(*args, **kwargs)

    monkeypatch.setattr(model_runner_module.ModelRunner, "execute", spy_execute)
    monkeypatch.setattr(model_runner_module, "sample", spy_sample)
    return calls


def decode(llm: LLM, temperature: float, prompts=PROMPTS, **kw) -> list[list[int]]:
    params = SamplingParams(temperature=temperature, max_tokens=NEW, ignore_eos=True, **kw)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def check_greedy_rows_beside_temperature_rows(llm: LLM, path, device: str, cpu: list[bool]) -> None:
    """Per-row temperatures in one graph step (a row staged at the wrong place would draw where it should not):
    greedy rows beside temperature-1 rows keep transformers' greedy tokens, and the CPU samples nothing (cpu:
    cpu_sampling_steps' spy)."""
    prompts = PROMPTS[:16]
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.0, max_tokens=12) for i in range(16)]
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert not any(cpu)
    assert outs[1::2] == hf_oracle.hf_greedy(path, prompts[1::2], 12, torch.float32, device)


def check_engine_seed_reproduces_draws(make) -> None:
    """make(seed) → an engine: the same engine seed gives the same tokens; another one draws other decode tokens
    (not only another prefill token)."""
    a = decode(make(5), 1.0, PROMPTS[:16])
    assert decode(make(5), 1.0, PROMPTS[:16]) == a
    b = decode(make(6), 1.0, PROMPTS[:16])
    assert sum(x[1:] != y[1:] for x, y in zip(a, b)) >= 12


def _chi2_quantile(dof: int, z: float = 3.09) -> float:
    """Wilson-Hilferty: the chi-square quantile at normal score z (3.09: 99.9%)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


@torch.inference_mode()
def decode_log_probs(path, outs: list[list[int]], temperature: float, device: str, prompts=PROMPTS):
    """For the tokens of decode steps (outputs 1..; output 0 is the prefill's): ([D, V] float64 transformers'
    log softmax(logits / t) at their positions, [D] the tokens). One forward over right-padded sequences (causal:
    the padding comes after every position read)."""
    model = hf_oracle.hf_model(path, torch.float32, device)
    seqs = [p + o for p, o in zip(prompts, outs)]
    width = max(len(s) for s in seqs)
    logits = model(torch.tensor([s + [0] * (width - len(s)) for s in seqs], device=device)).logits.double().cpu()
    rows = [logits[i, len(p) : len(p) + len(o) - 1] for i, (p, o) in enumerate(zip(prompts, outs))]  # → out[1:]
    tokens = torch.tensor([t for o in outs for t in o[1:]])
    return (torch.cat(rows) / temperature).log_softmax(-1), tokens


def chi_square(log_probs: torch.Tensor, tokens: torch.Tensor) -> tuple[float, float]:
    """(statistic, 99.9% threshold): the tokens counted per id against the sum of their positions' probabilities
    (ids expected fewer than 5 times pooled in one cell). Each draw given its past is one categorical draw, so the
    statistic is at most as spread as a multinomial's: the threshold is conservative."""
    observed = torch.bincount(tokens, minlength=log_probs.shape[1]).double()
    expected = log_probs.exp().sum(0)
    big = expected >= 5
    o = torch.cat([observed[big], observed[~big].sum().unsqueeze(0)])
    e = torch.cat([expected[big], expected[~big].sum().unsqueeze(0)])
    return float(((o - e) ** 2 / e).sum()), _chi2_quantile(len(o) - 1)


def likelihood_z(log_probs: torch.Tensor, tokens: torch.Tensor) -> float:
    """z-score of the drawn tokens' total log-probability against its mean and variance when each token is drawn
    from its position's distribution (a martingale: about N(0, 1)). Too hot draws score low, too cold (or argmax)
    high: the direct check of the temperature."""
    p = log_probs.exp()
    mean = (p * log_probs).sum(-1)  # E[log p(x)] = -entropy, per position
    var = (p * log_probs**2).sum(-1) - mean**2
    drawn = log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return float((drawn - mean).sum() / var.sum().sqrt())


Z_LIMIT = 4.0  # |z| above it: p < 1e-4 under the right distribution


def distribution_stats(path, outs: list[list[int]], temperature: float, device: str,
                       prompts=PROMPTS) -> tuple[float, float, float]:
    """(chi-square, its 99.9% threshold, likelihood z) of the decode steps' tokens at `temperature`."""
    log_probs, tokens = decode_log_probs(path, outs, temperature, device, prompts)
    return (*chi_square(log_probs, tokens), likelihood_z(log_probs, tokens))
