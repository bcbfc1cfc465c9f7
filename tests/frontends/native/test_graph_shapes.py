"""Graph shapes (graph_shapes.py) and the padding of a step into one (InputBuilder.build(batch, shape)), on the
contract: every real token and sequence where the unpadded step has it; padding tokens write nowhere; padding
sequences own the padding tokens, evenly, none longer than max_model_len; logits rows of the completing sequences
first."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import Qwen3Config

from atom_core.config import AtomConfig
from atom_frontends.native.graph_shapes import ShapeLadder, batch_size_ladder, mixed_shape, token_ladder
from atom_frontends.native.inputs import PAD_SLOT, InputBuilder, pad_lengths
from tests.frontends.native.test_mla_metadata import scheduled


def test_ladders():
    assert token_ladder(2048) == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert token_ladder(100) == [16, 32, 64, 100] and token_ladder(16) == [16] and token_ladder(8) == [8]
    assert batch_size_ladder(20) == [1, 2, 4, 8, 16, 20]


@pytest.mark.parametrize("tokens, seqs, want", [
    (1, 1, (1, 1, 1)), (5, 5, (8, 8, 8)), (8, 8, (8, 8, 8)),  # decode-only: batch sizes
    (2, 1, (16, 9, 8)), (16, 3, (16, 9, 8)), (17, 3, (32, 9, 8)),  # anything else: token counts
    (64, 8, (64, 9, 8)), (65, 2, None),  # over the budget: eager
])
def test_pick(tokens, seqs, want):
    ladder = ShapeLadder(batch_size_ladder(8), token_ladder(64), 8, 4096)
    shape = ladder.pick(tokens, seqs)
    assert (None if shape is None else tuple(shape)) == want


def test_mixed_shapes_hold_padding_within_max_model_len():
    for tokens, max_len in ((2048, 4096), (2048, 1000), (64, 24), (16, 16)):
        shape = mixed_shape(tokens, 8, max_len)
        for real_seqs in range(0, min(tokens, 8) + 1):
            q = pad_lengths(tokens - real_seqs, shape.seqs - real_seqs)  # the fewest real tokens: one a sequence
            assert q.sum() == tokens - real_seqs and q.max() - q.min() <= 1 and q.max() <= max_len


def test_padded_build_keeps_the_real_step_and_pads_to_the_contract():
    rng = random.Random(0)
    cfg = AtomConfig(hf_config=Qwen3Config(), block_size=4, max_model_len=40, max_num_seqs=8, max_num_batched_tokens=64)
    inputs = InputBuilder(cfg, torch.device("cpu"))
    ladder = ShapeLadder(batch_size_ladder(8), token_ladder(64), 8, 40)
    for _ in range(40):
        batch = [scheduled(rng.randrange(12), rng.choice([1, 1, rng.randint(2, 12)]), rng)
                 for _ in range(rng.randint(1, 5))]
        n, n_tok = len(batch), sum(s.num_new_tokens for s in batch)
        plain = inputs.build(batch)
        md = plain.metadata
        want = [t.clone() for t in (plain.input_ids, md.positions, md.slot_mapping, md.seq_lens, md.query_start_loc,
                                    md.block_tables, plain.logits_indices)]
        shape = ladder.pick(n_tok, n)
        step = inputs.build(batch, shape)
        md = step.metadata
        assert step.input_ids.shape[0] == shape.tokens and md.seq_lens.shape[0] == shape.seqs
        assert step.logits_indices.shape[0] == shape.rows
        for got, w in zip((step.input_ids, md.positions, md.slot_mapping), want[:3]):
            assert torch.equal(got[:n_tok], w)
        assert torch.equal(md.seq_lens[:n], want[3]) and torch.equal(md.query_start_loc[: n + 1], want[4])
        assert torch.equal(md.block_tables[:n, : want[5].shape[1]], want[5])
        assert not md.block_tables[:n, want[5].shape[1]:].any() and not md.block_tables[n:].any()
        rows = len(want[6])
        assert torch.equal(step.logits_indices[:rows], want[6]) and not step.logits_indices[rows:].any()
        assert (md.slot_mapping[n_tok:] == PAD_SLOT).all() and not md.positions[n_tok:].any()
        own = np.diff(md.query_start_loc.numpy())[n:]
        assert own.sum() == shape.tokens - n_tok and (md.seq_lens[n:].numpy() == own).all()
        assert (not len(own) or own.max() - own.min() <= 1) and md.query_start_loc[-1] == shape.tokens
