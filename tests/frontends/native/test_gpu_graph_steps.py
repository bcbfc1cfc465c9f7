"""A decode-only step on GPU is one CUDA graph: pending inputs resolved on the device, forward, logits of every
row and sample_tokens on them (argmax for greedy rows). What the CPU still does after the graph, when that is not
every row's answer, must see the same tokens as transformers on the same GPU in fp32 (overlap scheduling on and
off):
- greedy with HF's repetition penalty (reads the previous step's tokens, which the graph overwrote) and
  min_tokens holding off an early stop token;
- logprobs of the chosen and top tokens (from the graph's logits);
- one-token prefill chunks that sample nothing, in a step of one-token rows (a graph step whose logits rows
  are not all sampled).
The canary breaks the rule that picks the graph's argmax and expects the penalty comparison to fail. Last: a capture
right after an engine was dropped in a reference cycle (cuda_graphs.no_gc).
"""

from __future__ import annotations

import gc

import pytest
import torch

from atom_frontends.native import SamplingParams
from atom_frontends.native import model_runner as model_runner_module
from tests.frontends.native.hf_oracle import random_prompts
from tests.frontends.native.test_gpu_parity import hf_greedy, hf_model, native
from tests.frontends.native.test_overlap import assert_all_free, penalties_and_min_tokens

pytestmark = pytest.mark.gpu
MODES = pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
NEW = 24


@pytest.fixture(autouse=True)
def ieee_fp32():
    torch.backends.cuda.matmul.allow_tf32 = False


def _penalties_and_min_tokens(path, overlap: bool) -> tuple[list[list[int]], list[list[int]]]:
    """test_overlap's comparison (HF's repetition penalty < 1 and > 1, min_tokens) on the GPU, with graphs."""
    engines = []

    def make(p):
        engines.append(native(p, "float32", False, overlap_scheduling=overlap))
        return engines[-1]

    out = penalties_and_min_tokens(path, make, "cuda")
    assert engines[0].engine.runner.graphs.replays > 0
    return out


@MODES
def test_penalties_and_min_tokens_in_graph_steps(checkpoint_factory, overlap):
    ours, want = _penalties_and_min_tokens(checkpoint_factory("LlamaForCausalLM"), overlap)
    assert ours == want


def test_canary_graph_argmax_taken_under_penalties_is_caught(checkpoint_factory, monkeypatch):
    """Break it on purpose: the graph's argmax taken as the answer even where penalties apply."""
    monkeypatch.setattr(model_runner_module, "graph_sample_suffices", lambda reqs: True)
    ours, want = _penalties_and_min_tokens(checkpoint_factory("LlamaForCausalLM"), True)
    assert ours != want


@MODES
@torch.inference_mode()
def test_logprobs_in_graph_steps_match_hf(checkpoint_factory, overlap):
    path = checkpoint_factory("Qwen3ForCausalLM")
    prompts = random_prompts([12, 31], seed=77)
    ref = hf_greedy(path, prompts, 12)
    llm = native(path, "float32", False, overlap_scheduling=overlap)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, logprobs=3), use_tqdm=False)
    assert llm.engine.runner.graphs.replays > 0
    model = hf_model(path, torch.float32)
    for p, r, o in zip(prompts, ref, outs):
        c = o.outputs[0]
        assert c.token_ids == r
        ids = torch.tensor([p + r], device="cuda")
        want = model(ids).logits[0, len(p) - 1 : -1].float().log_softmax(-1)  # [12, V]: position i predicts r[i]
        top = want.topk(3, dim=-1)
        for i, d in enumerate(c.logprobs):
            assert d[r[i]].logprob == pytest.approx(want[i, r[i]].item(), abs=1e-4)
            assert [t for t, lp in d.items() if lp.rank <= 3] == top.indices[i].tolist()


@MODES
def test_one_token_chunks_in_graph_steps_match_hf(checkpoint_factory, monkeypatch, overlap):
    """A budget of 4 tokens with 4 sequence slots: while 3 sequences decode, the 4th prefills 1 token per step,
    so steps of one-token rows (graph steps) carry a chunk that samples nothing."""
    steps = []
    execute = model_runner_module.ModelRunner.execute

    def spy(self, batch):
        steps.append((self.graph_shape(batch) is not None, all(s.completes for s in batch)))
        return execute(self, batch)

    monkeypatch.setattr(model_runner_module.ModelRunner, "execute", spy)
    path = checkpoint_factory("Qwen3ForCausalLM")
    prompts = random_prompts([5, 9, 7, 13, 6, 11], seed=78)
    llm = native(path, "float32", False, max_num_seqs=4, max_num_batched_tokens=4, overlap_scheduling=overlap)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(path, prompts, NEW)
    assert (True, False) in steps  # a graph step with a row that sampled nothing
    assert_all_free(llm)


def test_capture_after_an_engine_dropped_in_a_reference_cycle(checkpoint_factory):
    """An engine dropped while in a reference cycle is not collected in the middle of the next engine's graph
    capture (cuda_graphs.no_gc): freeing its graphs, pinned buffers or events there would invalidate the capture.
    The collector is made to run after nearly every allocation while the second engine is built."""
    path = checkpoint_factory("Qwen3ForCausalLM")
    prompts = random_prompts([9, 17], seed=5)
    cycle = [native(path, "float32", False)]
    cycle.append(cycle)
    del cycle
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        llm = native(path, "float32", False)
    finally:
        gc.set_threshold(*thresholds)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW), use_tqdm=False)
    assert llm.engine.runner.graphs.replays > 0
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(path, prompts, NEW)
