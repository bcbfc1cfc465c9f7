"""The transformers oracle refuses a reference that could not tell a working model from a broken one."""

from __future__ import annotations

import pytest

from tests.frontends.native.hf_oracle import hf_greedy, random_prompts, require_informative, shuffle_context


def test_refuses_transformers_default_init_on_a_tied_qwen3(checkpoint_factory):
    # transformers' own init (std 0.02) with tied embeddings: one token repeated whatever the context
    path = checkpoint_factory("Qwen3ForCausalLM", initializer_range=0.02)
    with pytest.raises(AssertionError, match="degenerate transformers reference.*fewer than 4 distinct"):
        hf_greedy(path, random_prompts([3, 17, 40, 64, 9]), 32)


def test_refuses_outputs_that_ignore_the_context():
    prompts = random_prompts([10, 20, 30])
    outs = [[5, 6, 7, 8, 9, 10, 11, 12]] * 3
    with pytest.raises(AssertionError, match="shuffling the context changed only 0 of 3"):
        require_informative("ckpt", prompts, 8, outs, [o[:8] for o in outs])
    require_informative("ckpt", prompts, 8, outs, [[1] * 8, [2] * 8, outs[2]])  # 2 of 3 changed: fine


def test_a_large_batch_may_hold_a_few_flat_outputs():
    # 256 chat-like prompts on the serve load test's checkpoint gave 3 flat continuations by chance; one in twenty
    # of a large batch is allowed, more is refused, and a small batch allows none
    prompts = random_prompts([12] * 40)
    varied = [[i, i + 1, i + 2, i + 3, 7, 8, 9, 10] for i in range(40)]
    shuffled = [[1] * 8] * 40
    require_informative("ckpt", prompts, 8, [[5] * 8] * 2 + varied[2:], shuffled)
    with pytest.raises(AssertionError, match=r"outputs \[0, 1, 2\] have fewer than 4 distinct"):
        require_informative("ckpt", prompts, 8, [[5] * 8] * 3 + varied[3:], shuffled)
    with pytest.raises(AssertionError, match=r"outputs \[0\] have fewer than 4 distinct"):
        require_informative("ckpt", prompts[:19], 8, [[5] * 8] + varied[1:19], shuffled[:19])


def test_refuses_eos_at_once():
    with pytest.raises(AssertionError, match="first token"):
        require_informative("ckpt", random_prompts([2, 2]), 16, [[2], [2]], [[2], [3]])


def test_shuffle_changes_every_context_of_three_or_more_tokens():
    for p in random_prompts([3, 4, 9, 40], seed=3):
        s = shuffle_context(p)
        assert s != p and sorted(s) == sorted(p) and s[-1] == p[-1]


def test_fixture_tokenizer_is_the_same_in_every_process():
    """The byte-level tokenizer of the fixtures maps each byte to one id, whatever the process (it once
    followed a hash set's order, so text prompts, and the tests built on them, changed from run to run)."""
    import os
    import subprocess
    import sys

    code = "from atom_frontends.native.demo import byte_level_tokenizer as t; print(t()('Hé, world').input_ids)"
    ids = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONHASHSEED=seed)).stdout for seed in ("1", "2", "3")}
    assert len(ids) == 1, ids
