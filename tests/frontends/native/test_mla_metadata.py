"""The native MLA decode metadata (kv_indptr / kv_indices, refilled in persistent buffers by the InputBuilder) on
the CPU reference path: against the contract written out with Python lists from the scheduled requests' block
ids, and against a rebuild in fresh tensors, over many steps of changing batch sizes, mixed query lengths and
padded CUDA-graph steps (decode and mixed shapes); max_query_len; the persistent_mla_decode_metadata switch."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DeepseekV3Config, Qwen3Config

from atom_core.config import AtomConfig
from atom_frontends.native.graph_shapes import GraphShape, decode_shape, mixed_shape
from atom_frontends.native.inputs import InputBuilder, pad_lengths
from atom_frontends.native.request import Request
from atom_frontends.native.sampling_params import SamplingParams
from atom_frontends.native.scheduler import Scheduled
from atom_kernels.reference.mla import MLADecodeMetadata, mla_decode_metadata

BLOCK, MAX_SEQS, MAX_LEN = 4, 8, 64


def builder(hf_config=None, **switches) -> InputBuilder:
    cfg = AtomConfig(hf_config=hf_config or DeepseekV3Config(kv_lora_rank=24), block_size=BLOCK,
                     max_model_len=MAX_LEN, max_num_seqs=MAX_SEQS, max_num_batched_tokens=128, **switches)
    return InputBuilder(cfg, torch.device("cpu"))


def scheduled(computed: int, new: int, rng: random.Random) -> Scheduled:
    """A request with `computed` tokens cached and `new` scheduled, its blocks distinct random ids."""
    total = computed + new
    req = Request("r", None, [rng.randrange(100) for _ in range(total)], SamplingParams(), frozenset())
    req.num_computed_tokens = computed
    spare = rng.randrange(2) if total <= MAX_LEN - BLOCK else 0  # maybe one block more than needed
    req.block_ids = rng.sample(range(1000), -(-total // BLOCK) + spare)
    return Scheduled(req, new)


def random_batch(rng: random.Random, decode_only: bool) -> list[Scheduled]:
    batch = []
    for _ in range(rng.randint(1, MAX_SEQS)):
        computed = rng.randrange(MAX_LEN - 1 if decode_only else MAX_LEN // 2)
        new = 1 if decode_only or rng.random() < 0.5 else rng.randint(1, MAX_LEN // 2 - 1)
        batch.append(scheduled(computed, new, rng))
    return batch


def contract(batch: list[Scheduled], shape: GraphShape | None) -> tuple[list[int], list[int]]:
    """kv_indptr and the live kv_indices: each sequence's first ceil(seq_len / BLOCK) block ids; the padding
    sequences of a graph step own the padding tokens, spread evenly, each a context of its own tokens in block 0
    (a decode shape: one token each)."""
    pages = [s.request.block_ids[: -(-(s.request.num_computed_tokens + s.num_new_tokens) // BLOCK)] for s in batch]
    if shape is not None:
        pad = pad_lengths(shape.tokens - sum(s.num_new_tokens for s in batch), shape.seqs - len(batch))
        pages += [[0] * -(-int(q) // BLOCK) for q in pad]
    indptr = [0]
    for p in pages:
        indptr.append(indptr[-1] + len(p))
    return indptr, [b for p in pages for b in p]


def step_metadata(inputs: InputBuilder, batch, shape=None):
    md = inputs.build(batch, shape).metadata
    assert md.mla_decode is not None  # made by the builder, for every MLA layer of the step
    return md, md.mla_decode


def test_persistent_buffers_over_many_steps_equal_a_rebuild_and_the_contract():
    rng = random.Random(0)
    inputs = builder()
    ptrs = {inputs.mla_buffers.kv_indptr.data_ptr(), inputs.mla_buffers.kv_indices.data_ptr()}
    sizes = set()
    for step in range(90):
        kind = step % 3  # 0: eager, 1: padded to a mixed (token-count) shape, 2: a decode step padded to a size
        batch = random_batch(rng, decode_only=kind == 2)
        n_tok = sum(s.num_new_tokens for s in batch)
        shape = None
        if kind == 1:
            shape = mixed_shape(rng.randint(n_tok, 128), MAX_SEQS, MAX_LEN)
        elif kind == 2:
            shape = decode_shape(rng.randint(len(batch), MAX_SEQS))
        md, meta = step_metadata(inputs, batch, shape)
        sizes.add((len(batch), shape))
        assert {meta.kv_indptr.data_ptr(), meta.kv_indices.data_ptr()} == ptrs  # refilled in place
        indptr, indices = contract(batch, shape)
        assert meta.kv_indptr.tolist() == indptr
        assert meta.kv_indices[: len(indices)].tolist() == indices
        fresh = mla_decode_metadata(md.block_tables, md.seq_lens, BLOCK)  # rebuilt in new tensors
        assert fresh.kv_indptr.tolist() == indptr
        assert fresh.kv_indices[: len(indices)].tolist() == indices
    assert len(sizes) > 20  # the batch size did change


def test_mixed_query_lengths_and_max_query_len():
    """max_query_len (the MLA kernels' routing hint, ATOM's max_qo_len) is the maximum over all sequences, not the
    last one's; decodes and chunks of any length share one metadata."""
    rng = random.Random(1)
    inputs = builder()
    for q_lens in ([1, 17, 1, 3], [30, 1], [2, 2, 9, 1, 1], [1, 1, 1]):
        batch = [scheduled(rng.randrange(20), q, rng) for q in q_lens]
        md, meta = step_metadata(inputs, batch)
        assert md.max_query_len == max(q_lens)
        assert md.num_decodes == q_lens.count(1) and md.num_prefills == len(q_lens) - q_lens.count(1)
        assert md.query_start_loc.tolist() == [sum(q_lens[:i]) for i in range(len(q_lens) + 1)]
        indptr, indices = contract(batch, None)
        assert meta.kv_indptr.tolist() == indptr and meta.kv_indices[: len(indices)].tolist() == indices


def test_switch_off_rebuilds_every_step():
    inputs = builder(persistent_mla_decode_metadata=False)
    assert inputs.mla_buffers is None
    rng = random.Random(2)
    seen = set()
    for _ in range(3):
        batch = random_batch(rng, decode_only=False)
        md = inputs.build(batch).metadata
        assert md.mla_decode is None and not md.plan_cache  # nothing made ahead: the kernels make it
        meta = mla_decode_metadata(md.block_tables, md.seq_lens, BLOCK, md.plan_cache)
        assert mla_decode_metadata(md.block_tables, md.seq_lens, BLOCK, md.plan_cache) is meta  # once a step
        seen.add(meta.kv_indices.data_ptr())
        indptr, indices = contract(batch, None)
        assert meta.kv_indptr.tolist() == indptr and meta.kv_indices[: len(indices)].tolist() == indices
    assert len(seen) == 3  # fresh tensors every step


def test_switch_default_is_read_from_the_environment(monkeypatch):
    assert builder().mla_buffers is not None  # default on
    monkeypatch.setenv("ATOM_USE_PERSISTENT_MLA_DECODE_METADATA", "0")
    assert builder().mla_buffers is None
    assert builder(persistent_mla_decode_metadata=True).mla_buffers is not None  # the field wins
    monkeypatch.setenv("ATOM_USE_PERSISTENT_MLA_DECODE_METADATA", "maybe")
    with pytest.raises(ValueError, match="ATOM_USE_PERSISTENT_MLA_DECODE_METADATA='maybe'"):
        builder()


def test_models_without_mla_get_no_buffers():
    inputs = builder(Qwen3Config())
    assert inputs.mla_buffers is None
    md = inputs.build([scheduled(3, 1, random.Random(3))]).metadata
    assert md.mla_decode is None and not md.plan_cache


def test_buffers_too_small_for_a_step_are_named():
    inputs = builder()
    md = inputs.build([scheduled(3, 1, random.Random(4))]).metadata
    tiny = MLADecodeMetadata(torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="MLA decode buffers for 0 sequences"):
        mla_decode_metadata(md.block_tables, md.seq_lens, BLOCK, buffers=tiny)


@pytest.mark.gpu
@pytest.mark.parametrize("persistent", ["1", "0"], ids=["persistent", "rebuilt"])
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
def test_deepseek_decode_step_syncs_only_to_read_tokens(checkpoint_factory, monkeypatch, enforce_eager, persistent):
    """The MLA decode metadata (refilled or rebuilt), the latent write and the MLA kernels add no device sync to a
    decode step, which has none (test_gpu_sync: its one wait is on the event after the tokens' copy)."""
    from atom_frontends.native import LLM
    from tests.frontends.native.test_gpu_sync import sync_sites_per_step

    llm = LLM(checkpoint_factory("DeepseekV3ForCausalLM"), dtype="bfloat16", num_kv_blocks=256, max_num_seqs=4,
              enforce_eager=enforce_eager, persistent_mla_decode_metadata=persistent == "1")
    assert (llm.engine.runner.graphs is None) == enforce_eager
    assert (llm.engine.runner.inputs.mla_buffers is not None) == (persistent == "1")
    for sites in sync_sites_per_step(llm, steps=5):
        assert not sites, sites
