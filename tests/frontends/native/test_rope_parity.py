"""Dynamic (NTK) rope where it matters: greedy tokens of the native engine == transformers on the same checkpoint.

Our table is transformers' own dynamic formula evaluated once, at seq_len = max(max_model_len,
max_position_embeddings) (atom_core/layers/rotary.py). Beyond the checkpoint's range (max_model_len 256
over max_position_embeddings 64) the oracle is transformers' model with its rotary frozen there:
`ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=256)` and no per-call update. In range it is plain
transformers `generate`, which never scales a sequence within max_position_embeddings.
"""

from __future__ import annotations

import pytest
import torch

from atom_core.layers import rotary
from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import hf_model, informative_greedy, random_prompts

DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
NEW_TOKENS = 40
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
# Prompt + output cross 64 (all but the first); the first stays below 64 and is scaled all the same.
LONG = [20, 50, 70, 100]


def _checkpoint(factory, max_pos: int):
    return factory("LlamaForCausalLM", max_position_embeddings=max_pos, rope_parameters=DYNAMIC)


def _hf_greedy(path, prompts: list[list[int]], frozen_at: int | None = None) -> list[list[int]]:
    """transformers `generate`, one prompt at a time; with frozen_at, its rotary is fixed at that seq_len."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = hf_model(path)
    rope = model.model.rotary_emb
    assert rope.rope_type == "dynamic", rope.rope_type  # the checkpoint really carries the scaling
    if frozen_at is not None:
        inv_freq, rope.attention_scaling = ROPE_INIT_FUNCTIONS["dynamic"](model.config, "cpu", seq_len=frozen_at)
        rope.register_buffer("inv_freq", inv_freq, persistent=False)
        rope.rope_type = "default"  # transformers' dynamic update only runs for "dynamic": frozen from here on
    outs = informative_greedy(model, prompts, NEW_TOKENS, path)  # refuses outputs that do not vary
    if frozen_at is not None:
        assert torch.equal(rope.inv_freq, inv_freq)  # nothing updated it during generate
    return outs


@pytest.fixture(scope="module")
def beyond_range(checkpoint_factory):
    """(checkpoint with max_position_embeddings 64, prompts, transformers frozen at 256)."""
    path = _checkpoint(checkpoint_factory, 64)
    prompts = random_prompts(LONG)
    return path, prompts, _hf_greedy(path, prompts, frozen_at=256)


def _ours(path, prompts, **llm_args) -> list[list[int]]:
    outs = LLM(path, block_size=8, num_kv_blocks=64, **llm_args).generate(prompts, GREEDY, use_tqdm=False)
    # no early stop: every output crosses
    assert [len(o.outputs[0].token_ids) for o in outs] == [NEW_TOKENS] * len(prompts)
    return [o.outputs[0].token_ids for o in outs]


def test_dynamic_beyond_max_position_embeddings(beyond_range):
    path, prompts, expected = beyond_range
    assert _ours(path, prompts, max_model_len=256) == expected


def test_dynamic_beyond_range_chunked_prefill(beyond_range):
    """One table for every step: chunking a prompt changes nothing (transformers' own update would)."""
    path, prompts, expected = beyond_range
    assert _ours(path, prompts, max_model_len=256, max_num_batched_tokens=24) == expected


def test_an_unscaled_table_is_caught(beyond_range, monkeypatch):
    """The comparison above can fail: evaluated at max_position_embeddings (the unscaled base) we differ."""
    path, prompts, expected = beyond_range
    real = rotary.compute_inv_freq
    monkeypatch.setattr(rotary, "compute_inv_freq", lambda p, dim, max_pos, _context: real(p, dim, max_pos, max_pos))
    assert _ours(path, prompts, max_model_len=256) != expected


@pytest.mark.parametrize("max_model_len", [None, 100])  # None: max_position_embeddings (128)
def test_dynamic_in_range_equals_plain_transformers(checkpoint_factory, max_model_len):
    path = _checkpoint(checkpoint_factory, 128)
    prompts = random_prompts([20, 50, 58], seed=1)  # prompt + output <= 98
    assert _ours(path, prompts, max_model_len=max_model_len) == _hf_greedy(path, prompts)
