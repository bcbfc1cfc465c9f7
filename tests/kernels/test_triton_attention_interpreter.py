"""The Triton prefill kernel (and the op around it, decodes launched longest first too) vs the torch reference
under Triton's CPU interpreter.

Tiny shapes on CPU tensors, in a subprocess (TRITON_INTERPRET is read at import). float32 and float16 only
(the interpreter of triton 3.6 multiplies bf16 tiles as raw int16 bits), fp8 K/V with scales. The GPU tests
(test_triton_attention.py) cover the compiled kernels at larger shapes.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from atom_kernels.triton.attention import paged_attention  # noqa: E402  (after the triton skip)
from atom_kernels.triton.attention.common import softmax_scale  # noqa: E402
from atom_kernels.triton.attention.prefill import launch_prefill  # noqa: E402
from tests.interpreter import run_under_interpreter  # noqa: E402
from tests.kernels.test_triton_attention import check, expected, make_batch, positional  # noqa: E402

F32, F16, FP8 = torch.float32, torch.float16, torch.float8_e4m3fn
D, BLOCK_SIZE = 16, 4
# (context length, new tokens): a first-chunk prefill, chunks over a cached prefix (one spanning two query
# tiles of 16 rows even at GROUP 1), a decode row, a one-token first chunk.
SPECS = [(13, 13), (41, 19), (9, 1), (7, 2), (1, 1)]
# (query heads, kv heads): GROUP 1 (MHA), 2, 3 (not a power of two: spare tile rows), 4, 8.
HEADS = [(2, 2), (4, 2), (6, 2), (4, 1), (8, 1)]


def check_prefill(heads, kv_heads, dtype, cache_dtype=None, window=0, layout="native", seed=0) -> None:
    """launch_prefill alone (every sequence, 1-token ones too) with 16 x 16 tiles, so a tile holds 16 / GROUP
    tokens and long queries span several tiles; then the public op (prefill + decode kernels, its own tiles)."""
    b, hints = make_batch(SPECS, heads, kv_heads, D, BLOCK_SIZE, dtype, cache_dtype, layout, seed, device="cpu")
    want = expected(b, window or None)
    out = torch.full_like(b["query"], float("nan"))
    launch_prefill(*positional(b)[:-1], softmax_scale(D**-0.5), window, b["k_scale"], b["v_scale"], out,
                   skip_decodes=False, block_m=16, block_n=16, num_warps=4, num_stages=2)
    check(out, want, dtype)
    out = torch.full_like(b["query"], float("nan"))
    paged_attention(*positional(b), sliding_window=window or None, k_scale=b["k_scale"], v_scale=b["v_scale"],
                    out=out, **hints)
    check(out, want, dtype)


def check_decode_order(dtype, cache_dtype=None, seed=0) -> None:
    """Decodes of more programs than one wave (the interpreter counts 8 SMs: 16 slots; 9 sequences x 2 KV heads)
    through the op with a step memo: launched longest first, the order made once; the same answer."""
    specs = [(1 + 11 * i % 47, 1) for i in range(9)]
    b, hints = make_batch(specs, 4, 2, D, BLOCK_SIZE, dtype, cache_dtype, seed=seed, device="cpu")
    memo = {}
    out = torch.full_like(b["query"], float("nan"))
    paged_attention(*positional(b), k_scale=b["k_scale"], v_scale=b["v_scale"], out=out, plan_cache=memo, **hints)
    assert [k[0] for k in memo] == ["triton.decode_order"], memo
    check(out, expected(b), dtype)


def interpreter_checks() -> None:
    """Run with TRITON_INTERPRET=1 on a machine without a GPU."""
    for heads, kv_heads in HEADS:
        for dtype in (F32, F16):
            check_prefill(heads, kv_heads, dtype, seed=heads + kv_heads)
    for window in (1, 5, 16):
        check_prefill(6, 2, F32, window=window, seed=window)
        check_prefill(2, 2, F16, window=window, seed=window)
    for dtype in (F32, F16):
        check_prefill(4, 2, dtype, FP8, seed=3)
        check_prefill(8, 1, dtype, FP8, window=5, seed=4)
    check_prefill(4, 1, F32, layout="vllm", seed=5)  # strided K/V halves of one [blocks, kv_heads, bs, 2d]
    check_decode_order(F32, seed=6)
    check_decode_order(F16, FP8, seed=7)
    print("interpreter checks passed")


@pytest.mark.slow
def test_prefill_under_the_interpreter():
    """The checks above in a subprocess. The interpreter of triton 3.6 cannot run loops with runtime bounds
    under numpy >= 2.4."""
    code = "from tests.kernels.test_triton_attention_interpreter import interpreter_checks; interpreter_checks()"
    run_under_interpreter(code, "interpreter checks passed")
