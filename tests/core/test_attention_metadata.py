"""AttentionMetadata.from_query_lens, the one constructor every host's builder uses: max_query_len and the
prefill/decode counts follow from the query lengths alone, with the meaning the attention kernels give them (the
Triton decode kernel serves every sequence whose query_start_loc step is 1, the prefill kernel the longer ones,
tests/kernels/test_triton_attention*.py), over the batch orders the hosts produce. The counts against vLLM's own
split: tests/frontends/vllm/test_metadata.py."""

from __future__ import annotations

import itertools

import pytest
import torch

from atom_core.forward_context import AttentionMetadata
from tests.interpreter import run_under_interpreter

# name → (context length, new tokens) per sequence, in the order a host hands them over.
BATCHES = {
    "all decodes": [(9, 1), (1, 1), (30, 1)],
    "all prefills": [(13, 13), (41, 19), (7, 2)],
    "one-token chunk over a cached prefix": [(9, 1)],
    "one-token first chunk next to a prefill": [(1, 1), (13, 13)],
    "vLLM: decodes first, then prefills, then padding requests": [(9, 1), (5, 1), (41, 19), (7, 2), (7, 0), (7, 0)],
    "SGLang MIXED: extends, then decode tails": [(7, 7), (30, 30), (1, 1), (12, 1)],
    "native: chunks and decodes interleaved": [(20, 1), (41, 19), (3, 1), (9, 4)],
}


def metadata(specs: list[tuple[int, int]]) -> AttentionMetadata:
    q_lens = [q for _, q in specs]
    tokens = sum(q_lens)
    as_int = dict(dtype=torch.int32)
    return AttentionMetadata.from_query_lens(
        q_lens, slot_mapping=torch.full((tokens,), -1), block_tables=torch.zeros(len(specs), 16, **as_int),
        seq_lens=torch.tensor([c for c, _ in specs], **as_int),
        query_start_loc=torch.tensor([0, *itertools.accumulate(q_lens)], **as_int),
        positions=torch.zeros(tokens, dtype=torch.int64), max_seq_len=max(c for c, _ in specs))


def kernel_split(md: AttentionMetadata) -> tuple[int, int]:
    """(decodes, prefills) as the Triton kernels route sequences: by their query_start_loc step."""
    steps = (md.query_start_loc[1:] - md.query_start_loc[:-1]).tolist()
    return sum(s == 1 for s in steps), sum(s > 1 for s in steps)


@pytest.mark.parametrize("name", BATCHES)
def test_counts_mean_what_the_kernels_route(name):
    specs = BATCHES[name]
    md = metadata(specs)
    assert (md.num_decodes, md.num_prefills) == kernel_split(md)
    assert md.max_query_len == int((md.query_start_loc[1:] - md.query_start_loc[:-1]).max())
    assert md.num_tokens == sum(q for _, q in specs)
    assert md.num_decodes + md.num_prefills == sum(q > 0 for _, q in specs)  # padding requests are neither


def test_edge_counts():
    assert (metadata(BATCHES["all decodes"]).num_decodes, metadata(BATCHES["all decodes"]).num_prefills) == (3, 0)
    assert (metadata(BATCHES["all prefills"]).num_decodes, metadata(BATCHES["all prefills"]).num_prefills) == (0, 3)
    chunk = metadata(BATCHES["one-token chunk over a cached prefix"])
    assert (chunk.num_decodes, chunk.num_prefills, chunk.max_query_len) == (1, 0, 1)
    padded = metadata(BATCHES["vLLM: decodes first, then prefills, then padding requests"])
    assert (padded.num_decodes, padded.num_prefills, padded.max_query_len) == (2, 2, 19)


def test_bad_query_lengths_are_named():
    md = metadata(BATCHES["all decodes"])
    tensors = dict(slot_mapping=md.slot_mapping, block_tables=md.block_tables, seq_lens=md.seq_lens,
                   query_start_loc=md.query_start_loc, positions=md.positions, max_seq_len=md.max_seq_len)
    with pytest.raises(ValueError, match="2 query lengths for 3 sequences"):
        AttentionMetadata.from_query_lens([1, 1], **tensors)
    with pytest.raises(ValueError, match="negative query length"):
        AttentionMetadata.from_query_lens([1, -1, 1], **tensors)


def interpreter_checks() -> None:
    """The Triton paged_attention op, hinted by the constructor's metadata, == the torch reference on every batch
    (padding requests left out: the reference takes a batch's real requests)."""
    from atom_kernels.triton.attention import paged_attention
    from tests.kernels.test_triton_attention import check, expected, make_batch, positional

    for name, specs in BATCHES.items():
        specs = [s for s in specs if s[1]]
        b, _ = make_batch(specs, 4, 2, 16, 4, torch.float32, device="cpu", seed=len(name))
        md = metadata(specs)
        out = torch.full_like(b["query"], float("nan"))
        paged_attention(*positional(b), out=out, max_query_len=md.max_query_len, max_seq_len=md.max_seq_len,
                        num_decodes=md.num_decodes, num_prefills=md.num_prefills, plan_cache=md.plan_cache)
        check(out, expected(b), torch.float32)
    print("interpreter checks passed")


@pytest.mark.slow
def test_triton_kernels_agree_with_the_reference_under_these_counts():
    pytest.importorskip("triton")
    run_under_interpreter("from tests.core.test_attention_metadata import interpreter_checks; interpreter_checks()",
                          "interpreter checks passed")
