"""Padded graph steps on a CPU: every step an engine schedules (prefills alone, prefills beside decodes, chunks
continuing a prompt, prefix-cache hits, decode-only steps; 1..N sequences; token counts just under, at and just over
the ladder's edges) is run twice from the same KV cache: unpadded and eagerly (ModelRunner._eager_step), and padded
to its graph shape through the function a CUDA graph captures (ModelRunner.graph_step via
StepGraphs(capture=False), the step a replay runs). The real rows' hidden states and logits must be equal (to
float32 rounding: MoE), the KV slots the real tokens own must hold the same values, and every other slot of the
cache must be bit for bit what it was (the padding wrote nothing). Then the engine goes on with the padded step, and
its greedy tokens must equal transformers'. The canary gives padding tokens a real slot and expects the check to
fail. GPU: the same engine with real CUDA graphs, mixed graphs on and off (test_gpu_mixed_graphs.py).
"""

from __future__ import annotations

import pytest
import torch

from atom_frontends.native import LLM, SamplingParams
from atom_frontends.native import inputs as inputs_module
from atom_frontends.native.model_runner import ModelRunner
from tests.frontends.native.hf_oracle import hf_greedy, random_prompts

ARCHS = {
    "qwen3": ("Qwen3ForCausalLM", {}),  # the fused q/k norm + rope + KV write
    "llama": ("LlamaForCausalLM", {}),
    "qwen3-moe": ("Qwen3MoeForCausalLM", {}),
    "deepseek-v3": ("DeepseekV3ForCausalLM", {}),  # MLA: the latent write, MLA decode metadata of padded steps
}
# Dense models give the same bits; in MoE models the padding tokens join the experts' batches, whose GEMMs then
# round a few values differently (2e-7 seen): float32's default tolerance, and the same greedy tokens.
CLOSE = dict(rtol=1.3e-6, atol=1e-5)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _slot_rows(layer) -> list[torch.Tensor]:
    """The layer's cache views as [slots, features] (slot = block * block_size + offset)."""
    return [v.reshape(v.shape[0] * v.shape[1], -1) for v in layer.cache_views()]


class TwinSteps:
    """Wraps ModelRunner.execute: each step with a graph shape is first run unpadded (eager) and padded (the graph
    step, run eagerly) from the same cache and compared; the cache is put back, then the step runs for real."""

    def __init__(self, llm: LLM, monkeypatch) -> None:
        self.runner = runner = llm.engine.runner
        assert runner.graphs is None  # a CPU: no CUDA graphs; the same steps, replayed eagerly, stand in
        runner.graphs = runner.step_graphs(capture=False)
        self.seen: list[tuple[tuple[int, int, int], int, int, bool]] = []  # (shape, tokens, seqs, has prefill)
        execute = ModelRunner.execute

        def spy(runner_self, batch):
            if runner_self is self.runner:
                self.compare(batch)
            return execute(runner_self, batch)

        monkeypatch.setattr(ModelRunner, "execute", spy)

    def _state(self) -> list[torch.Tensor]:
        r = self.runner
        return [layer.kv_cache.clone() for layer in r.attn_layers] + [r.tokens.clone(), r.prev_tokens.clone()]

    def _restore(self, state: list[torch.Tensor]) -> None:
        r = self.runner
        for layer, cache in zip(r.attn_layers, state):
            layer.kv_cache.copy_(cache)
        r.tokens.copy_(state[-2])
        r.prev_tokens.copy_(state[-1])

    @torch.inference_mode()
    def compare(self, batch) -> None:
        r = self.runner
        shape = r.graph_shape(batch)
        if shape is None:
            return
        n_tok, rows = sum(s.num_new_tokens for s in batch), [i for i, s in enumerate(batch) if s.completes]
        before = self._state()
        step = r.inputs.build(batch)
        hidden, logits = r._eager_step(step, batch, rows)
        written = step.metadata.slot_mapping.clone()
        eager = [rows for layer in r.attn_layers for rows in _slot_rows(layer)]
        eager = [t.clone() for t in eager]
        self._restore(before)
        r.inputs.build(batch, shape)
        g_hidden, g_logits = r.graphs.replay(shape)
        assert g_hidden.shape[0] == shape.tokens and g_logits.shape[0] == shape.rows
        torch.testing.assert_close(g_hidden[:n_tok], hidden, **CLOSE)
        if rows:
            torch.testing.assert_close(g_logits[: len(rows)], logits, **CLOSE)
            assert torch.equal(r.tokens[: len(rows)], logits.argmax(-1))  # the graph's own (greedy) sampling
        self._check_cache(before, eager, written)
        self._restore(before)
        self.seen.append((tuple(shape), n_tok, len(batch), n_tok > len(batch)))

    def _check_cache(self, before: list[torch.Tensor], eager: list[torch.Tensor], written: torch.Tensor) -> None:
        """The real tokens' slots as the eager step wrote them; every other slot as it was."""
        r = self.runner
        old = []
        for layer, cache in zip(r.attn_layers, before):
            saved, layer.kv_cache = layer.kv_cache, cache  # the views of the saved cache
            old += [t.clone() for t in _slot_rows(layer)]
            layer.kv_cache = saved
        now = [t for layer in r.attn_layers for t in _slot_rows(layer)]
        untouched = torch.ones(now[0].shape[0], dtype=torch.bool)
        untouched[written] = False
        for o, e, n in zip(old, eager, now):
            torch.testing.assert_close(n[written], e[written], **CLOSE,
                                       msg="a real token's KV differs from the eager step's")
            assert torch.equal(n[untouched], o[untouched]), "the padded step wrote a slot no real token owns"


def engine(path, monkeypatch, **kw) -> tuple[LLM, TwinSteps]:
    kw = dict(dict(num_kv_blocks=128, block_size=4, max_num_seqs=8, max_num_batched_tokens=64), **kw)
    llm = LLM(path, **kw)
    return llm, TwinSteps(llm, monkeypatch)


def run(llm: LLM, prompts: list[list[int]], arrivals: list[int] | None = None) -> list[list[int]]:
    """Greedy outputs; prompt i is added before engine step arrivals[i] (default: all at once), so later ones
    prefill beside running decodes."""
    arrivals = arrivals or [0] * len(prompts)
    eng, ids, step = llm.engine, {}, 0
    outs = {}
    while len(outs) < len(prompts):
        for i, at in enumerate(arrivals):
            if at == step:
                ids[eng.add_request(prompts[i], GREEDY)] = i
        for out in eng.step():
            outs[ids[out.request_id]] = out.outputs[0].token_ids
        step += 1
    return [outs[i] for i in range(len(prompts))]


@pytest.fixture(params=list(ARCHS), scope="module")
def path(request, checkpoint_factory):
    arch, overrides = ARCHS[request.param]
    return checkpoint_factory(arch, **overrides)


@pytest.mark.parametrize("overlap", [False, True], ids=["no-overlap", "overlap"])
def test_padded_steps_equal_unpadded_ones(path, monkeypatch, overlap):
    # lengths around the ladder's edges (16, 32, 64) alone; then 1..8 sequences at once; then arrivals among
    # decodes; then prompts longer than the budget (chunks continuing a prompt beside decodes)
    lengths = [15, 16, 17, 31, 32, 33, 63, 64]
    llm, twin = engine(path, monkeypatch, overlap_scheduling=overlap)
    alone = [run(llm, random_prompts([n], seed=n))[0] for n in lengths]
    prompts = random_prompts([3, 9, 5, 12, 7, 4, 11, 6], seed=7)
    together = [run(llm, prompts[:k]) for k in (1, 2, 5, 8)]
    staggered = run(llm, prompts, arrivals=[0, 0, 2, 3, 3, 5, 8, 9])
    long = random_prompts([90, 70, 5], seed=8)
    chunked = run(llm, long, arrivals=[0, 1, 1])
    n_tok = {t for _, t, _, _ in twin.seen}
    assert {15, 16, 17, 31, 32, 33, 63, 64} <= n_tok  # the edges, and the budget itself (64): chunks of it
    assert {s for _, _, s, prefill in twin.seen if prefill} >= {1, 2, 5, 8}
    assert any(prefill and t > s for _, t, s, prefill in twin.seen)  # mixed and prefill steps were compared
    assert any(not prefill for *_, prefill in twin.seen)  # and decode-only steps
    want = hf_greedy(path, prompts, GREEDY.max_tokens)
    assert together == [want[:k] for k in (1, 2, 5, 8)] and staggered == want
    assert alone == hf_greedy(path, [random_prompts([n], seed=n)[0] for n in lengths], GREEDY.max_tokens)
    assert chunked == hf_greedy(path, long, GREEDY.max_tokens)


def test_prefix_cache_hits_in_padded_steps(checkpoint_factory, monkeypatch):
    path = checkpoint_factory("Qwen3ForCausalLM")
    llm, twin = engine(path, monkeypatch)
    head = random_prompts([24], seed=9)[0]
    prompts = [head + tail for tail in random_prompts([5, 13, 3], seed=10)]
    first = run(llm, prompts[:1])
    rest = run(llm, prompts[1:])
    cached = llm.generate(prompts[1:2], GREEDY, use_tqdm=False)[0].num_cached_tokens
    assert cached >= 24 and twin.seen
    assert first + rest == hf_greedy(path, prompts, 6)


def test_canary_padding_given_a_real_slot_is_caught(checkpoint_factory, monkeypatch):
    """Break it on purpose: padding tokens write slot 0 (block 0: a real token's K/V, which the real rows then read
    wrong, or a slot no one owns)."""
    monkeypatch.setattr(inputs_module, "PAD_SLOT", 0)
    llm, _ = engine(checkpoint_factory("LlamaForCausalLM"), monkeypatch)
    with pytest.raises(AssertionError, match="not close|wrote a slot no real token owns|differs from the eager"):
        run(llm, random_prompts([5, 9, 3], seed=11))


def test_budget_above_max_model_len_pads_over_several_sequences(checkpoint_factory, monkeypatch):
    """A step budget (64) above max_model_len (24): a padding sequence holds at most max_model_len tokens, so the
    64-token shape has ceil(64 / 24) = 3 sequences more than its 8 real ones could need."""
    path = checkpoint_factory("LlamaForCausalLM")
    llm, twin = engine(path, monkeypatch, max_model_len=24)
    prompts = random_prompts([17, 9, 12, 6], seed=12)
    assert run(llm, prompts) == hf_greedy(path, prompts, GREEDY.max_tokens)
    assert (64, 11, 8) in {shape for shape, *_ in twin.seen}
