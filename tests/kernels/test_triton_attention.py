"""Triton paged attention vs the torch reference (computed on CPU copies of the same inputs).

Every cache slot no sequence owns, and every block-table entry past a sequence's blocks (which
points at a reserved block), holds NaN: a kernel reading a key it must not see turns the output NaN.
Outputs are NaN-poisoned before each call.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from atom_kernels import reference as ref  # noqa: E402  (after the triton skip)
from atom_kernels.triton.attention import paged_attention  # noqa: E402
from atom_kernels.triton.attention.common import softmax_scale  # noqa: E402
from atom_kernels.triton.attention.decode import _decode_kernel, _merge_kernel, decode_slots, launch_decode  # noqa: E402
from atom_kernels.triton.attention.prefill import _prefill_kernel, launch_prefill, prefill_config  # noqa: E402

pytestmark = pytest.mark.gpu
F32, BF16, F16, FP8 = torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn
TOL = {F32: 1e-4, BF16: 1.5e-2, F16: 2e-3}
NAMES = {F32: "f32", BF16: "bf16", F16: "f16", FP8: "fp8"}


def ids(value):
    """Readable test ids for dtypes (pytest's default for the rest)."""
    return NAMES.get(value) if isinstance(value, torch.dtype) else None
# (context length, new tokens): first-chunk prefills, decodes, chunks over a cached prefix.
MIXED = [(1, 1), (37, 37), (100, 1), (200, 63), (513, 1), (65, 2), (16, 1), (3, 3)]
# Prefills spanning several query tiles of every config, over cached prefixes, odd lengths.
LONG = [(700, 300), (257, 257), (1000, 129), (5, 1), (90, 2)]


def make_caches(num_blocks, block_size, kv_heads, d, dtype, layout, device="cuda"):
    """NaN-filled K/V caches of logical shape [num_blocks, block_size, kv_heads, d] in a host's layout."""
    if layout == "vllm":  # [blocks, kv_heads, block_size, 2d], K then V on the last dim
        raw = nan_tensor((num_blocks, kv_heads, block_size, 2 * d), dtype, device)
        return raw[..., :d].transpose(1, 2), raw[..., d:].transpose(1, 2)
    if layout == "sglang":  # token pool [slots, kv_heads, d], i.e. block size 1
        assert block_size == 1
        return tuple(nan_tensor((num_blocks, kv_heads, d), dtype, device).unsqueeze(1) for _ in range(2))
    return tuple(nan_tensor((num_blocks, block_size, kv_heads, d), dtype, device) for _ in range(2))


def nan_tensor(shape, dtype, device="cuda"):
    return torch.full(shape, float("nan"), device=device).to(dtype)


def make_batch(specs, heads, kv_heads, d, block_size, dtype, cache_dtype=None, layout="native", seed=0,
               device="cuda"):
    """specs: [(context_len, q_len)]. Random K/V for every context token written through the reference."""
    g = torch.Generator().manual_seed(seed)
    cache_dtype = cache_dtype or dtype
    blocks = [-(-ctx // block_size) for ctx, _ in specs]
    num_blocks = sum(blocks) + 2
    perm = torch.randperm(num_blocks - 1, generator=g)  # block num_blocks - 1 stays NaN: the table padding
    table = torch.full((len(specs), max(blocks) + 2), num_blocks - 1, dtype=torch.int32)
    start = 0
    for i, n in enumerate(blocks):
        table[i, :n] = perm[start : start + n]
        start += n
    kc, vc = make_caches(num_blocks, block_size, kv_heads, d, cache_dtype, layout, device)
    scales = (None, None)
    if cache_dtype == FP8:
        scales = (torch.tensor(0.35, device=device), torch.tensor(1.8, device=device))
    for i, (ctx, _) in enumerate(specs):
        pos = torch.arange(ctx)
        slots = (table[i, pos // block_size].long() * block_size + pos % block_size).to(device)
        k = torch.randn(ctx, kv_heads, d, generator=g).to(dtype).to(device)
        v = torch.randn(ctx, kv_heads, d, generator=g).to(dtype).to(device)
        ref.write_kv_cache(k, v, kc, vc, slots, *scales)
    q_lens = [q for _, q in specs]
    query = torch.randn(sum(q_lens), heads, d, generator=g).to(dtype).to(device)
    qsl = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    seq_lens = torch.tensor([ctx for ctx, _ in specs], dtype=torch.int32).to(device)
    hints = dict(max_query_len=max(q_lens), max_seq_len=max(c for c, _ in specs),
                 num_decodes=q_lens.count(1), num_prefills=len(q_lens) - q_lens.count(1))
    return dict(query=query, k_cache=kc, v_cache=vc, block_tables=table.to(device), seq_lens=seq_lens,
                query_start_loc=qsl, k_scale=scales[0], v_scale=scales[1]), hints


ARGS = ("query", "k_cache", "v_cache", "block_tables", "seq_lens", "query_start_loc")


def positional(b, device=None):
    """The contract's positional arguments (query ... query_start_loc, scale), optionally moved."""
    return [b[k].to(device) if device else b[k] for k in ARGS] + [b["query"].shape[-1] ** -0.5]


def expected(b, window=None):
    scales = {k: b[k].cpu() if b[k] is not None else None for k in ("k_scale", "v_scale")}
    return ref.paged_attention(*positional(b, "cpu"), sliding_window=window, **scales)


def run(b, hints, window=None):
    out = torch.full_like(b["query"], float("nan"))
    got = paged_attention(*positional(b), sliding_window=window, k_scale=b["k_scale"], v_scale=b["v_scale"],
                          out=out, **hints)
    assert got is out
    return out


def check(got, want, dtype):
    assert not got.isnan().any()
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype])


# GQA groups 1 (MHA), 2 (Qwen3-0.6B: 16/8), 3 and 7 (not powers of two), 4 (Llama-3-8B: 32/8), 8.
@pytest.mark.parametrize("dtype, heads, kv_heads, d, block_size", [
    (F32, 8, 8, 64, 16), (F32, 16, 2, 128, 1), (BF16, 16, 8, 128, 16), (BF16, 16, 2, 64, 32),
    (BF16, 8, 1, 128, 1), (BF16, 12, 12, 80, 5), (F16, 16, 2, 64, 16), (F16, 32, 4, 128, 7),
    (BF16, 32, 8, 128, 16), (F16, 12, 4, 64, 16), (BF16, 28, 4, 128, 16), (F32, 16, 4, 64, 3),
], ids=ids)
def test_mixed_prefill_decode_batch(dtype, heads, kv_heads, d, block_size):
    b, hints = make_batch(MIXED, heads, kv_heads, d, block_size, dtype, seed=heads + d + block_size)
    check(run(b, hints), expected(b), dtype)


@pytest.mark.parametrize("dtype, block_size, window, heads, kv_heads", [
    (BF16, 16, 7, 16, 8), (BF16, 1, 64, 16, 8), (F32, 16, 33, 16, 8), (F16, 3, 1, 16, 8), (BF16, 16, 100, 32, 8),
    (F16, 16, 9, 8, 8), (BF16, 8, 33, 28, 4)], ids=ids)
def test_sliding_window(dtype, block_size, window, heads, kv_heads):
    b, hints = make_batch(MIXED, heads, kv_heads, 128, block_size, dtype, seed=window)
    check(run(b, hints, window), expected(b, window), dtype)


@pytest.mark.parametrize("dtype, block_size, layout, heads, kv_heads", [
    (BF16, 16, "native", 16, 2), (BF16, 1, "native", 16, 2), (F16, 16, "vllm", 16, 2), (F32, 8, "native", 16, 2),
    (BF16, 16, "native", 32, 8), (F16, 16, "vllm", 12, 4)], ids=ids)
def test_fp8_kv_cache_with_scales(dtype, block_size, layout, heads, kv_heads):
    b, hints = make_batch(MIXED, heads, kv_heads, 128, block_size, dtype, FP8, layout, seed=block_size)
    check(run(b, hints), expected(b), dtype)


@pytest.mark.parametrize("dtype, heads, kv_heads, window", [
    (BF16, 16, 16, 0), (BF16, 16, 8, 0), (BF16, 32, 8, 0), (BF16, 16, 2, 0), (F16, 32, 8, 0), (F32, 16, 4, 0),
    (BF16, 16, 8, 200), (BF16, 32, 8, 77), (F16, 28, 4, 0)], ids=ids)
def test_long_prefills_over_prefixes(dtype, heads, kv_heads, window):
    """Several query tiles per sequence at the op's own tile config, per GQA group."""
    b, hints = make_batch(LONG, heads, kv_heads, 128, 16, dtype, seed=heads + window)
    check(run(b, hints, window or None), expected(b, window or None), dtype)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=ids)
@pytest.mark.parametrize("heads, kv_heads", [(8, 8), (16, 8), (32, 8), (28, 4), (16, 1)])
def test_every_prefill_tile_config(dtype, heads, kv_heads):
    """Each tile config prefill_config can pick (short chunks to long prompts) on the same batch."""
    b, _ = make_batch(LONG, heads, kv_heads, 128, 16, dtype, seed=heads)
    want = expected(b)
    group = heads // kv_heads
    for max_query_len in (2, 5, 40, 4096):
        cfg = prefill_config(max_query_len, 128, dtype == F32, group)
        out = torch.full_like(b["query"], float("nan"))
        launch_prefill(*positional(b)[:-1], softmax_scale(128**-0.5), 0, None, None, out, skip_decodes=False, **cfg)
        check(out, want, dtype)


@pytest.mark.parametrize("dtype, layout, block_size", [
    (BF16, "vllm", 16), (F32, "vllm", 5), (BF16, "sglang", 1), (F32, "sglang", 1)], ids=ids)
def test_host_cache_views(dtype, layout, block_size):
    b, hints = make_batch(MIXED, 8, 2, 64, block_size, dtype, layout=layout, seed=7)
    assert b["k_cache"].is_contiguous() == (layout == "sglang")  # vLLM's K/V halves are strided views
    check(run(b, hints), expected(b), dtype)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=ids)
@pytest.mark.parametrize("num_splits, block_n", [(1, 64), (3, 32), (40, 16)])
def test_decode_split_counts(dtype, num_splits, block_n):
    """Any split count gives the same answer, also with splits left empty (40 x 16 keys > 300 keys)."""
    specs = [(300, 1), (1, 1), (129, 1), (64, 1)]
    b, _ = make_batch(specs, 16, 4, 128, 16, dtype, seed=num_splits)
    out = torch.full_like(b["query"], float("nan"))
    qk_scale = softmax_scale(128**-0.5)
    launch_decode(*positional(b)[:-1], qk_scale, 0, None, None, out, num_splits, block_n, 4, 2)
    check(out, expected(b), dtype)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("order", ["longest", "shortest", "random"])
def test_decode_any_launch_order(num_splits, order):
    """The launch order is any permutation of the sequences (decode_order's longest-first one, or a stale one a
    host kept by mistake): each sequence is still attended exactly once, so the answer is the same."""
    specs = [(300, 1), (1, 1), (129, 1), (64, 1), (40, 7), (1000, 1), (17, 1)]
    b, _ = make_batch(specs, 16, 4, 128, 16, BF16, seed=num_splits)
    lens = b["seq_lens"]
    perm = {"longest": torch.argsort(lens, descending=True), "shortest": torch.argsort(lens),
            "random": torch.randperm(len(specs), device="cuda")}[order].to(torch.int32)
    out = torch.full_like(b["query"], float("nan"))
    launch_decode(*positional(b)[:-1], softmax_scale(128**-0.5), 0, None, None, out, num_splits, 64, 4, 2,
                  order=perm)
    decode = torch.repeat_interleave(torch.tensor([q == 1 for _, q in specs]), torch.tensor([q for _, q in specs]))
    check(out[decode], expected(b)[decode], BF16)
    assert out[~decode].isnan().all()  # the prefill row is the prefill kernel's


def test_decode_order_made_once_a_step():
    """paged_attention with the step's memo: a batch of more programs than one wave runs longest first, the order
    made once for every layer of the step; a batch of one wave, or a call without a memo, keeps batch order."""
    g = torch.Generator().manual_seed(5)
    big = [(int(n), 1) for n in torch.randint(1, 700, (decode_slots(torch.device("cuda")) // 8 + 9,), generator=g)]
    b, hints = make_batch(big, 16, 8, 128, 16, BF16, seed=5)
    memo = {}
    out = paged_attention(*positional(b), plan_cache=memo, **hints)
    check(out, expected(b), BF16)
    (key, order), = memo.items()
    assert key[0] == "triton.decode_order"
    assert order.dtype == torch.int32 and torch.equal(b["seq_lens"][order.long()],
                                                      b["seq_lens"].sort(descending=True).values)
    again = paged_attention(*positional(b), plan_cache=memo, **hints)  # the next layer: the same order, no new one
    assert list(memo.values()) == [order] and torch.equal(again, out)
    small, hints = make_batch(big[:3], 16, 8, 128, 16, BF16, seed=6)
    memo = {}
    check(paged_attention(*positional(small), plan_cache=memo, **hints), expected(small), BF16)
    assert memo == {}


@pytest.mark.parametrize("dtype", [BF16, F16], ids=ids)
@pytest.mark.parametrize("num_splits, block_n, num_warps, v_regs, f16_dots", [
    (1, 64, 4, True, True), (3, 32, 8, True, True), (40, 16, 4, True, True), (3, 64, 8, False, True),
    (2, 64, 4, False, False)])
def test_decode_fp8_launch_variants(dtype, num_splits, block_n, num_warps, v_regs, f16_dots):
    """fp8 K/V: V through registers or shared memory, fp16 or query-dtype dots, any split count."""
    specs = [(300, 1), (1, 1), (129, 1), (64, 1), (1000, 1)]
    b, _ = make_batch(specs, 16, 2, 128, 16, dtype, FP8, seed=num_splits + block_n)
    out = torch.full_like(b["query"], float("nan"))
    qk_scale = softmax_scale(128**-0.5)
    launch_decode(*positional(b)[:-1], qk_scale, 0, b["k_scale"], b["v_scale"], out, num_splits, block_n,
                  num_warps, 3, v_regs=v_regs, f16_dots=f16_dots)
    check(out, expected(b), dtype)


@pytest.mark.parametrize("hints", [
    {},  # no hints: both kernels launched, splits sized from the block table
    dict(max_query_len=512, max_seq_len=4096, num_decodes=8, num_prefills=8),  # loose upper bounds (graphs)
    dict(max_query_len=63, max_seq_len=513, num_decodes=0, num_prefills=8),  # 1-token rows left to prefill
])
def test_hints_only_tune(hints):
    b, _ = make_batch(MIXED, 16, 8, 128, 16, BF16, seed=len(hints))
    check(run(b, hints), expected(b), BF16)


def test_decode_only_batch_and_default_out():
    b, hints = make_batch([(1000, 1), (17, 1), (1, 1)], 16, 8, 128, 16, BF16, seed=3)
    got = paged_attention(*positional(b), **hints)
    assert got.dtype == BF16 and got.shape == b["query"].shape
    check(got, expected(b), BF16)


def test_launcher_rejects_bad_arguments():
    b, hints = make_batch([(5, 5)], 8, 2, 64, 16, BF16)
    args = positional(b)
    with pytest.raises(ValueError, match="head_dim"):
        paged_attention(b["query"][..., :32], *args[1:])
    with pytest.raises(ValueError, match="multiple of kv heads"):
        paged_attention(b["query"][:, :3], *args[1:])
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_attention(*args[:5], b["query_start_loc"][:1], args[6])
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        paged_attention(*args, k_scale=torch.ones((), device="cuda"))


def compiled(kernel) -> int:
    """How many variants of a Triton kernel this process compiled for the current GPU."""
    return len(kernel.device_caches[torch.cuda.current_device()][0])


def shifted(t: torch.Tensor, offset: int) -> torch.Tensor:
    """t's values in a view `offset` elements into a new buffer: the address alignment of a slice of a host's
    step buffer, which moves with the batch's sizes."""
    buf = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    view = buf[offset:].view(t.shape)
    view.copy_(t)
    return view


def test_step_varying_args_compile_once():
    """Batches of 1, 2, 3, 16, 17 sequences (block tables of other widths, metadata at every alignment) reuse
    the kernels compiled for the first: Triton specializes ints equal to 1 or divisible by 16 and 16-byte
    aligned pointers unless told not to, which recompiled kernels mid-serving."""
    qk_scale = softmax_scale(128**-0.5)
    kernels = (_prefill_kernel, _decode_kernel, _merge_kernel)
    before = None
    for i, n in enumerate((5, 1, 2, 3, 16, 17)):
        specs = [(40 + 37 * j, 1 if j % 2 else 9 + j) for j in range(n)]
        b, _ = make_batch(specs, 16, 8, 128, 16, BF16, seed=n)
        meta = [shifted(b[k], i % 4) for k in ("block_tables", "seq_lens", "query_start_loc")]
        args = (b["query"], b["k_cache"], b["v_cache"], *meta, qk_scale, 0, None, None)
        out = torch.full_like(b["query"], float("nan"))
        launch_prefill(*args, out, skip_decodes=True, block_m=64, block_n=64, num_warps=4, num_stages=2)
        order = torch.randperm(n, device="cuda").to(torch.int32) if i % 2 else None  # (a runtime flag)
        launch_decode(*args, out, 9 if i % 2 else 16, 64, 4, 2, order=order)  # both 16 rows of partials in the merge
        check(out, expected(b), BF16)
        counts = [compiled(k) for k in kernels]
        before = before or counts
        assert counts == before, f"batch of {n}: compiled variants {counts}, after the first batch {before}"


def test_step_buffer_slices_compile_once():
    """rotary, write_kv_cache and the fused qk-norm-rope write read positions / slot mapping sliced from a
    host's step buffer: every token count and alignment reuses one compiled kernel."""
    from atom_kernels.triton.fused_qk_norm_rope import _fused_kernel, fused_qk_norm_rope_write_kv
    from atom_kernels.triton.kv_cache import _write_kv_kernel, write_kv_cache
    from atom_kernels.triton.rotary import _rotary_kernel, rotary
    from tests.kernels.test_triton_fused import _inputs
    from tests.kernels.test_triton_norm_rope_act import ROPE_TOL

    kc, vc = make_caches(64, 16, 8, 128, F32, "native")
    kernels = (_rotary_kernel, _write_kv_kernel, _fused_kernel)
    before = None
    for i, t in enumerate((5, 1, 2, 3, 16, 17)):
        positions, q, k, v, wq, wk, cos_sin = _inputs(t, 16, 8, 128, F32, seed=t)
        pos = shifted(positions, i % 2)
        slots = shifted(torch.randperm(64 * 16, device="cuda")[:t], i % 2)
        want_q, want_k = ref.rotary(positions.cpu(), q.cpu(), k.cpu(), cos_sin.cpu())
        got_q, got_k = rotary(pos, q, k, cos_sin)
        torch.testing.assert_close((got_q.cpu(), got_k.cpu()), (want_q, want_k), **ROPE_TOL[F32])
        write_kv_cache(k, v, kc, vc, slots)
        fused_qk_norm_rope_write_kv(pos, q, k, v, wq, wk, 1e-6, cos_sin, kc, vc, slots)
        counts = [compiled(kern) for kern in kernels]
        before = before or counts
        assert counts == before, f"{t} tokens: compiled variants {counts}, after the first call {before}"
