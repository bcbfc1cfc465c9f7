"""sample_tokens' Triton kernel under Triton's CPU interpreter (CI has no GPU), and the outside check of the
reference's Philox replica: the words and uniforms of Triton's own tl.randint4x / tl.rand, produced by a tiny
kernel in the interpreter.

Kernel vs reference: fp32 and fp16 logits (not bf16: the interpreter's bf16 is not the GPU's), vocabularies that are
not multiples of 4 or of the tile, one and several programs per row, several tiles per program (the interpreter
counts 8 SMs), greedy ties across quarters of the vocabulary. test_triton_sampling.py runs the same checks on a GPU.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.interpreter import run_under_interpreter  # noqa: E402  (after the triton skip)

# (rows, vocab): 1 row over 3 programs; 7 rows over 1-2 programs; 40 rows, 1 program of 3 tiles each; V < 4
SHAPES = [(1, 5003), (7, 1000), (40, 5001), (9, 3)]


def philox_checks() -> None:
    import triton
    import triton.language as tl

    from atom_kernels.reference.sampling import philox4x32, uniform

    @triton.jit
    def words_kernel(seed_ptr, words_ptr, rand_ptr, C: tl.constexpr):
        # program s: Philox words [4, C] and tl.rand [C] of seed s at counters 0..C-1
        s = tl.program_id(0)
        seed = tl.load(seed_ptr + s)
        i = tl.arange(0, C)
        w0, w1, w2, w3 = tl.randint4x(seed, i)
        base = words_ptr + s * 4 * C + i
        tl.store(base, w0.to(tl.int32, bitcast=True))
        tl.store(base + C, w1.to(tl.int32, bitcast=True))
        tl.store(base + 2 * C, w2.to(tl.int32, bitcast=True))
        tl.store(base + 3 * C, w3.to(tl.int32, bitcast=True))
        tl.store(rand_ptr + s * C + i, tl.rand(seed, i))

    seeds = torch.tensor([0, 1, 7, -1, 2**32 + 5, -2**63, 2**63 - 1, 123456789012345], dtype=torch.int64)
    c = 256
    words = torch.empty(len(seeds), 4, c, dtype=torch.int32)
    rand = torch.empty(len(seeds), c, dtype=torch.float32)
    words_kernel[(len(seeds),)](seeds, words, rand, C=c)
    mine = torch.stack(philox4x32(seeds, torch.arange(c)), dim=1)  # [S, 4, C]
    assert torch.equal(mine, words.long() & 0xFFFFFFFF)
    assert torch.equal(uniform(mine[:, 0]), rand)  # tl.rand is word 0 through uint_to_uniform_float
    print("philox replica matches tl.randint4x and tl.rand")


def kernel_checks() -> None:
    from atom_kernels.triton.sampling import sample_tokens
    from tests.kernels.test_triton_sampling import check_edge_rows, check_kernel

    for dtype in (torch.float32, torch.float16):
        for n, vocab in SHAPES:
            check_kernel(sample_tokens, n, vocab, dtype, "cpu", seed=n + vocab)
    check_edge_rows(sample_tokens, "cpu")
    print("kernel matches reference")


def test_philox_replica_matches_triton():
    code = "from tests.kernels.test_triton_sampling_interpreter import philox_checks; philox_checks()"
    run_under_interpreter(code, "philox replica matches tl.randint4x and tl.rand")


def test_kernel_matches_reference_under_the_interpreter():
    code = "from tests.kernels.test_triton_sampling_interpreter import kernel_checks; kernel_checks()"
    run_under_interpreter(code, "kernel matches reference")
