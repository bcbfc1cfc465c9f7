"""Triton MLA kernels (write_latent_cache, mla_attention's decode and prefill kernels, mla_kv_indices) vs the torch
references in atom_kernels.reference.mla, run on CPU copies of the same inputs.

GPU tests (marked gpu) run the compiled kernels on CUDA; test_kernels_under_the_interpreter runs the same checks
at tiny shapes on CPU tensors through Triton's interpreter in a subprocess (fp32 and fp16 queries only: the
interpreter of triton 3.6 multiplies bf16 tiles as raw int16 bits, rounds float32 -> bf16 stores by truncation
where the GPU rounds to nearest (stored bf16 rows are compared within one unit there) and gets float32 -> fp8
stores wrong (1.96 -> 1.0), so the fp8 cache write is checked on the GPU only). The decode kernel's prefetch and
f8_bits switches run there over fp32 caches (fp32 queries) and fp8 caches (fp16 queries; on the GPU bf16 ones),
f8_bits giving the native upcast's bits.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from atom_kernels import reference as ref  # noqa: E402  (after the triton skip)
from atom_kernels.reference.mla import MLADecodeMetadata, mla_decode_buffers, mla_decode_metadata  # noqa: E402
from atom_kernels.triton.attention import paged_attention  # noqa: E402
from atom_kernels.triton.attention.common import softmax_scale  # noqa: E402
from atom_kernels.triton.attention.decode import num_sms  # noqa: E402
from atom_kernels.triton.mla import mla_attention  # noqa: E402
from atom_kernels.triton.mla.cache import write_latent_cache  # noqa: E402
from atom_kernels.triton.mla.common import e4m3_bits_as_f16  # noqa: E402
from atom_kernels.triton.mla.decode import hopper, launch_mla_decode, mla_decode_config, wgmma_fits  # noqa: E402
from atom_kernels.triton.mla.kv_indices import mla_kv_indices  # noqa: E402
from tests.interpreter import run_under_interpreter  # noqa: E402

F32, BF16, F16, FP8 = torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn
# Outputs are O(1) weighted means of randn latent rows. bf16/fp16: rounded query and output; fp8: the same
# fp8 cache values on both sides, the query and P in fp16/bf16 on ours only.
TOL = {F32: dict(rtol=1e-4, atol=1e-4), BF16: dict(rtol=2e-2, atol=2e-2), F16: dict(rtol=5e-3, atol=5e-3)}
DECODES = [(1, 1), (17, 1), (33, 1), (100, 1), (64, 1)]  # (context incl. new tokens, new tokens)
MIXED = [(9, 1), (40, 23), (1, 1), (7, 7), (70, 1), (33, 2), (16, 16)]


def ids(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def mla_batch(seqs, heads, r, rope, block, dtype, cache_dtype, device, seed=0, scale=None):
    """A paged latent cache with shuffled blocks (written through the reference, with padding rows), its block
    tables (wider than needed, -1 past the used blocks), seq_lens, query_start_loc and the queries."""
    g = torch.Generator().manual_seed(seed)
    width = -(-max(n for n, _ in seqs) // block) + 2
    num_blocks = sum(-(-n // block) for n, _ in seqs) + 3
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.full((len(seqs), width), -1, dtype=torch.int32)
    rows, slots, used = [], [], 0
    for i, (n, _) in enumerate(seqs):
        need = -(-n // block)
        tables[i, :need] = perm[used:used + need].int()
        used += need
        rows.append(torch.randn(n, r + rope, generator=g))
        slots.append(torch.tensor([int(tables[i, p // block]) * block + p % block for p in range(n)]))
    cache = torch.full((num_blocks, block, r + rope), float("nan")).to(cache_dtype)  # unused rows: NaN
    ref.write_latent_cache(torch.cat(rows + [torch.randn(2, r + rope, generator=g)]), cache,
                           torch.cat(slots + [torch.tensor([-1, -1])]), scale)
    q_lens = [q for _, q in seqs]
    qsl = torch.tensor([0] + q_lens).cumsum(0).int()
    query = torch.randn(sum(q_lens), heads, r + rope, generator=g).to(dtype)
    seq_lens = torch.tensor([n for n, _ in seqs], dtype=torch.int32)
    to = dict(device=device)
    return (query.to(**to), cache.to(**to), tables.to(**to), seq_lens.to(**to), qsl.to(**to),
            None if scale is None else scale.to(**to))


def hints(seqs, exact=True):
    q_lens = [q for _, q in seqs]
    decodes = q_lens.count(1)
    return dict(max_query_len=max(q_lens), max_seq_len=max(n for n, _ in seqs) if exact else 4096,
                num_decodes=decodes, num_prefills=len(seqs) - decodes)


def check_mla(seqs, heads, r, rope, block, dtype, device, cache_dtype=None, with_hints=True, seed=0, **kw):
    cache_dtype = cache_dtype or dtype
    scale = torch.tensor(0.7) if cache_dtype == FP8 else None
    q, cache, tables, seq_lens, qsl, cs = mla_batch(seqs, heads, r, rope, block, dtype, cache_dtype, device, seed,
                                                    scale)
    sm_scale = (r + rope) ** -0.5 * 2
    got = mla_attention(q, cache, tables, seq_lens, qsl, sm_scale, r, cs, **(hints(seqs) if with_hints else {}), **kw)
    want = ref.mla_attention(*(a.cpu() for a in (q, cache, tables, seq_lens, qsl)), sm_scale, r,
                             None if cs is None else cs.cpu())
    assert got.shape == (q.shape[0], heads, r) and got.dtype == dtype
    assert got.isfinite().all()
    tol = TOL[BF16] if cache_dtype == FP8 else TOL[dtype]
    torch.testing.assert_close(got.cpu(), want, **tol)


def check_write(t, block, width, dtype, cache_dtype, device, scale=None, exact=True):
    g = torch.Generator().manual_seed(t)
    latent = torch.randn(t, width, generator=g).to(dtype)
    num_blocks = -(-t // block) + 2
    slots = torch.randperm(num_blocks * block, generator=g)[:t]
    slots[t // 2] = -1  # a padding token
    cache = torch.zeros(num_blocks, block, width).to(cache_dtype)
    want = cache.clone()
    ref.write_latent_cache(latent, want, slots, scale)
    got = cache.to(device)
    write_latent_cache(latent.to(device), got, slots.to(device), None if scale is None else scale.to(device))
    if exact:
        assert torch.equal(got.cpu().float(), want.float())
    else:  # bf16 under the interpreter: one unit in the last place
        torch.testing.assert_close(got.cpu().float(), want.float(), rtol=8e-3, atol=1e-2)


def check_kv_indices(seqs, block, device, width_extra=3, seed=0):
    """Against the reference and against the contract written out with Python lists."""
    g = torch.Generator().manual_seed(seed)
    lens = [n for n, _ in seqs]
    width = -(-max(lens) // block) + width_extra
    tables = torch.randint(0, 1000, (len(lens), width), generator=g, dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    indptr, indices = torch.full((len(lens) + 1,), 7, dtype=torch.int32), torch.full((len(lens) * width,), -5,
                                                                                       dtype=torch.int32)
    ref.mla_kv_indices(tables, seq_lens, block, indptr, indices)
    pages = [-(-n // block) for n in lens]
    want = [int(x) for i, p in enumerate(pages) for x in tables[i, :p]]
    assert indptr.tolist() == [sum(pages[:i]) for i in range(len(pages) + 1)]
    assert indices[: len(want)].tolist() == want
    d_indptr = torch.full_like(indptr, 9).to(device)
    d_indices = torch.zeros_like(indices).to(device)
    mla_kv_indices(tables.to(device), seq_lens.to(device), block, d_indptr, d_indices)
    assert d_indptr.cpu().tolist() == indptr.tolist()
    assert d_indices[: len(want)].cpu().tolist() == want


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=ids)
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("r, rope", [(512, 64), (24, 8)])
def test_decode_and_prefill_match_reference(r, rope, heads, dtype):
    # vLLM/native 16, SGLang's token pool, odd pages crossed inside tiles (each block size compiles anew: the
    # small latent takes all three)
    for block in (16, 1, 5) if r < 128 else (16,):
        check_mla(DECODES, heads, r, rope, block, dtype, "cuda")
        check_mla(MIXED, heads, r, rope, block, dtype, "cuda", seed=1)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=ids)
def test_fp8_latent_cache_matches_reference(heads, dtype):
    check_mla(DECODES, heads, 512, 64, 16, dtype, "cuda", cache_dtype=FP8)
    check_mla(MIXED, heads, 512, 64, 16, dtype, "cuda", cache_dtype=FP8, seed=2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16], ids=ids)
def test_long_contexts_many_splits(dtype):
    """Long decodes next to short ones (splits of which some are empty), without hints and with hints that are
    only upper bounds (as under CUDA graphs)."""
    seqs = [(5000, 1), (3, 1), (2049, 1), (777, 1)]
    check_mla(seqs, 16, 512, 64, 16, dtype, "cuda")
    check_mla(seqs, 16, 512, 64, 16, dtype, "cuda", with_hints=False)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3, 8])
@pytest.mark.parametrize("block_h", [16, 32, 64])
def test_every_decode_config(block_h, splits):
    for block_n in (16, 32):
        check_decode_config(DECODES, 128, 512, 64, BF16, "cuda", block_h, block_n, 4 if block_h == 16 else 8,
                            splits)


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch, f8_bits", [(True, False), (False, True), (True, True)], ids=str)
@pytest.mark.parametrize("block_h, block_n, warps", [(16, 32, 4), (16, 64, 8), (64, 32, 8), (64, 64, 8)], ids=str)
def test_decode_prefetch_and_f8_bits(block_h, block_n, warps, prefetch, f8_bits):
    """The decode kernel's switches on bf16 and fp8 caches, split or not; f8_bits gives the same bits as the
    native upcast (it only moves a power of two from the tiles to the scales)."""
    for cache_dtype in (BF16, FP8) if prefetch else (FP8,):  # f8_bits is for fp8 caches only
        for splits in (1, 3):
            got = check_decode_config(DECODES, 128, 512, 64, BF16, "cuda", block_h, block_n, warps, splits,
                                      cache_dtype, prefetch=prefetch, f8_bits=f8_bits)
            if f8_bits and cache_dtype == FP8:
                native = check_decode_config(DECODES, 128, 512, 64, BF16, "cuda", block_h, block_n, warps, splits,
                                             cache_dtype, prefetch=prefetch)
                assert torch.equal(got, native)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, cache_dtype", [(BF16, BF16), (F16, F16), (BF16, FP8), (F16, FP8)], ids=ids)
@pytest.mark.parametrize("splits", [1, 3, 8])
@pytest.mark.parametrize("heads", [16, 20, 32, 64, 100, 128])
def test_hopper_decode_matches_reference(heads, splits, dtype, cache_dtype):
    """Hopper's wgmma kernels (mla.hopper_few_heads up to 32 heads, mla.decode_hopper above): head groups with
    masked heads (20, 100), empty splits, contexts that end inside a tile and inside a page, one-token contexts,
    long ones over many tiles; fp8 caches with a scale."""
    if not hopper(torch.device("cuda")):
        pytest.skip("the wgmma kernel needs sm_90 (Hopper)")
    seqs = DECODES + [(1000, 1), (4099, 1), (129, 1)]
    check_decode_config(seqs, heads, 512, 64, dtype, "cuda", 64, 64, 8, splits, cache_dtype, wgmma=True)


@pytest.mark.gpu
@pytest.mark.parametrize("wgmma", [False, True], ids=["triton", "wgmma"])
@pytest.mark.parametrize("order", ["longest", "shortest", "random"])
def test_decode_any_launch_order(order, wgmma):
    """Any permutation of the sequences as the launch order (decode_order's longest-first one, or a stale one):
    each sequence is still attended exactly once, split or not."""
    if wgmma and not hopper(torch.device("cuda")):
        pytest.skip("the wgmma kernel needs sm_90 (Hopper)")
    seqs = DECODES + [(1000, 1), (4099, 1), (129, 1)]
    for splits in (1, 3):
        check_decode_config(seqs, 128, 512, 64, BF16, "cuda", 64, 64 if wgmma else 32, 8, splits, order=order,
                            wgmma=wgmma)
        if wgmma:  # the few-heads kernel, on an fp8 cache
            check_decode_config(seqs, 16, 512, 64, BF16, "cuda", 16, 64, 4, splits, FP8, order=order, wgmma=True)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
def test_decode_order_made_once_a_step(heads):
    """mla_attention with the step's memo: more programs than one wave run longest first (the order made once, in
    the memo), the same answer as the reference."""
    n = 2 * num_sms(torch.device("cuda")) + 7  # above one wave for the Triton kernel (2 an SM) and wgmma (1)
    g = torch.Generator().manual_seed(4)
    check_mla_order([(int(x), 1) for x in torch.randint(1, 300, (n,), generator=g)], heads, 512, 64, BF16, "cuda")


def check_mla_order(seqs, heads, r, rope, dtype, device):
    q, cache, tables, seq_lens, qsl, _ = mla_batch(seqs, heads, r, rope, 16, dtype, dtype, device)
    memo = {}
    got = mla_attention(q, cache, tables, seq_lens, qsl, 0.1, r, plan_cache=memo, **hints(seqs))
    orders = [v for k, v in memo.items() if isinstance(k, tuple) and k[0] == "triton.decode_order"]
    assert len(orders) == 1, list(memo)
    assert torch.equal(seq_lens[orders[0].long()], seq_lens.sort(descending=True).values)
    want = ref.mla_attention(*(a.cpu() for a in (q, cache, tables, seq_lens, qsl)), 0.1, r)
    torch.testing.assert_close(got.cpu(), want, **TOL[dtype])


@pytest.mark.gpu
def test_hopper_kernel_is_picked_where_it_fits():
    dev = torch.device("cuda")
    if not hopper(dev):
        pytest.skip("the wgmma kernel needs sm_90 (Hopper)")
    def picked(heads, dtype, cache_dtype, r=512, rope=64):
        q = torch.empty(32, heads, r + rope, dtype=dtype, device=dev)
        cache = torch.empty(4, 16, r + rope, dtype=cache_dtype, device=dev)
        fits = wgmma_fits(q, cache, r, q.new_empty(32, heads, r))
        return mla_decode_config(32, heads, 4096, dev, dtype, cache_dtype, fits)

    for heads in (8, 16, 32, 64, 128):  # mla.hopper_few_heads up to 32 heads, mla.decode_hopper above
        assert picked(heads, BF16, BF16)["wgmma"]
        assert picked(heads, F16, F16)["wgmma"]
        assert picked(heads, BF16, FP8)["wgmma"]
        assert not picked(heads, F32, F32)["wgmma"]
    # a latent the wgmma kernel does not take: the Triton kernel, split for its two programs an SM
    other = picked(128, BF16, BF16, r=256)
    assert not other["wgmma"]
    assert other["num_splits"] == mla_decode_config(32, 128, 4096, dev, BF16, BF16, False)["num_splits"]
    assert other["num_splits"] != picked(128, BF16, BF16)["num_splits"]


@pytest.mark.gpu
def test_e4m3_bits_as_f16_is_exact():
    check_e4m3_bits("cuda")


def check_decode_config(seqs, heads, r, rope, dtype, device, block_h, block_n, warps, splits, cache_dtype=None,
                        order=None, **switches):
    """The decode kernel (+ merge) with a launch config (and the prefetch / f8_bits switches) forced, whatever
    mla_decode_config would pick; order: launch the sequences "longest" / "shortest" first or in a "random"
    permutation (None: batch order). Returns its output."""
    cache_dtype = cache_dtype or dtype
    scale = torch.tensor(0.7) if cache_dtype == FP8 else None
    q, cache, tables, seq_lens, qsl, cs = mla_batch(seqs, heads, r, rope, 16, dtype, cache_dtype, device, scale=scale)
    if order is not None:
        perm = {"longest": lambda: torch.argsort(seq_lens.cpu(), descending=True),
                "shortest": lambda: torch.argsort(seq_lens.cpu()),
                "random": lambda: torch.randperm(len(seqs), generator=torch.Generator().manual_seed(3))}[order]()
        switches["order"] = perm.to(device=device, dtype=torch.int32)
    meta = MLADecodeMetadata(torch.empty(len(seqs) + 1, dtype=torch.int32, device=device),
                                 torch.empty(tables.numel(), dtype=torch.int32, device=device))
    mla_kv_indices(tables, seq_lens, 16, *meta)
    out = q.new_empty(q.shape[0], heads, r)
    sm = (r + rope) ** -0.5
    launch_mla_decode(q, cache, *meta, seq_lens, qsl, softmax_scale(sm), r, cs, out, block_h, block_n, warps, 2,
                      splits, **switches)
    want = ref.mla_attention(*(a.cpu() for a in (q, cache, tables, seq_lens, qsl)), sm, r,
                             None if cs is None else cs.cpu())
    torch.testing.assert_close(out.cpu(), want, **TOL[BF16 if cache_dtype == FP8 else dtype])
    return out


@triton.jit
def _e4m3_bits_kernel(x_ptr, out_ptr):
    i = tl.arange(0, 256)
    tl.store(out_ptr + i, e4m3_bits_as_f16(tl.load(x_ptr + i)))


def check_e4m3_bits(device):
    """Every e4m3 byte: e4m3_bits_as_f16 gives exactly value / 256 (the NaNs 0x7f and 0xff give +-1.875)."""
    x = torch.arange(256).to(torch.uint8).view(FP8)
    out = torch.empty(256, dtype=F16, device=device)
    _e4m3_bits_kernel[(1,)](x.to(device), out)
    got, v = out.cpu().float(), x.float()
    finite = v.isfinite()
    assert torch.equal(got[finite], v[finite] / 256)
    assert got[~finite].tolist() == [1.875, -1.875]


@pytest.mark.gpu
@pytest.mark.parametrize("cache_dtype, scale", [(F32, None), (BF16, None), (F16, 2.0), (FP8, 0.5)], ids=str)
def test_write_latent_cache_matches_reference(cache_dtype, scale):
    for t, block, width in [(1, 16, 576), (37, 16, 576), (100, 5, 32), (9, 1, 40)]:
        for dtype in (F32, BF16):
            check_write(t, block, width, dtype, cache_dtype, "cuda", None if scale is None else torch.tensor(scale))


@pytest.mark.gpu
def test_write_latent_cache_into_a_strided_view():
    """vLLM's [blocks, 1, block_size, D] latent view at head 0, inside a wider allocation."""
    base = torch.zeros(6, 1, 4, 600, device="cuda")
    view = base[:, 0, :, :576]
    latent = torch.randn(5, 576, device="cuda")
    slots = torch.tensor([3, 0, 22, -1, 9], device="cuda")
    write_latent_cache(latent, view, slots)
    want = torch.zeros(6, 4, 576)
    ref.write_latent_cache(latent.cpu(), want, slots.cpu())
    assert torch.equal(view.cpu(), want) and not base[..., 576:].any()


@pytest.mark.gpu
@pytest.mark.parametrize("block", [16, 1, 5])
def test_kv_indices_match_reference(block):
    check_kv_indices(DECODES + MIXED, block, "cuda")
    check_kv_indices([(n, 1) for n in range(1, 300, 7)], block, "cuda", seed=1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, heads", [(F32, 16), (BF16, 16), (BF16, 128)], ids=str)  # 128: Hopper's kernel
def test_cuda_graph_replay_with_other_lengths(dtype, heads):
    """Captured once with upper-bound hints and the decode metadata made in persistent buffers (the native engine's
    graph steps); replayed after new lengths, block tables and queries are copied into the same tensors."""
    r, rope, block = 512, 64, 16
    seqs = [(300, 1)] * 4  # every table row covers 300 tokens: any length up to 300 is valid on replay
    q, cache, tables, seq_lens, qsl, _ = mla_batch(seqs, heads, r, rope, block, dtype, dtype, "cuda")
    seq_lens.copy_(torch.tensor([300, 17, 1, 90], dtype=torch.int32))
    buffers = mla_decode_buffers(8, tables.shape[1], "cuda")
    h = hints(seqs, exact=False)
    sm = (r + rope) ** -0.5

    def step():
        meta = mla_decode_metadata(tables, seq_lens, block, {}, buffers)  # refilled in place, a new step's memo
        return mla_attention(q, cache, tables, seq_lens, qsl, sm, r, plan_cache={}, decode_metadata=meta, **h)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    g = torch.Generator().manual_seed(5)
    for lens in ([1, 2, 3, 4], [299, 250, 120, 33], [64, 1, 300, 16]):
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        tables.copy_(tables[torch.randperm(len(lens), generator=g)])
        q.copy_(torch.randn(q.shape, generator=g).to(dtype))
        graph.replay()
        want = ref.mla_attention(*(a.cpu() for a in (q, cache, tables, seq_lens, qsl)), sm, r)
        torch.testing.assert_close(out.cpu(), want, **TOL[dtype])


@pytest.mark.gpu
def test_inputs_on_two_devices_are_refused():
    q, cache, tables, seq_lens, qsl, _ = mla_batch(DECODES, 16, 24, 8, 4, F32, F32, "cuda")
    with pytest.raises(ValueError, match="different devices"):
        mla_attention(q, cache, tables.cpu(), seq_lens, qsl, 0.1, 24)


# ---------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("bad, match", [
    (dict(query=lambda q: q[..., :-1]), "latent cache rows are 32 wide"),
    (dict(query=lambda q: q.int()), "dtype torch.int32 not supported"),
    (dict(cache=lambda c: c.unsqueeze(1)), r"\[num_blocks, block_size, r \+ rope\] view"),
    (dict(r=lambda r: 32), "kv_lora_rank 32 must lie in"),
    (dict(qsl=lambda x: x[:-1]), "query_start_loc must be int"),
    (dict(tables=lambda t: t.float()), "block_tables must be int"),
])
def test_bad_arguments_are_named(bad, match):
    """Refused at launch time, before any kernel runs (so on CPU too)."""
    q, cache, tables, seq_lens, qsl, _ = mla_batch(DECODES, 4, 24, 8, 4, F32, F32, "cpu")
    args = dict(query=q, cache=cache, tables=tables, seq_lens=seq_lens, qsl=qsl, r=24)
    for name, change in bad.items():
        args[name] = change(args[name])
    with pytest.raises(ValueError, match=match):
        mla_attention(args["query"], args["cache"], args["tables"], args["seq_lens"], args["qsl"], 0.1, args["r"])


def test_too_many_decode_sequences_are_named():
    """The decode grids put the sequences on CUDA's third grid axis (at most 65535): a bigger batch is refused with
    a clear error before any kernel runs, for MLA and GQA decode alike."""
    n = 65536
    seq_lens, qsl = torch.ones(n, dtype=torch.int32), torch.arange(n + 1, dtype=torch.int32)
    tables = torch.zeros(n, 1, dtype=torch.int32)
    hints = dict(max_query_len=1, max_seq_len=1, num_decodes=n, num_prefills=0)
    with pytest.raises(ValueError, match="at most 65535"):
        mla_attention(torch.zeros(n, 4, 32), torch.zeros(1, 16, 32), tables, seq_lens, qsl, 0.1, 24, **hints)
    kv = torch.zeros(1, 16, 1, 16)
    with pytest.raises(ValueError, match="at most 65535"):
        paged_attention(torch.zeros(n, 2, 16), kv, kv, tables, seq_lens, qsl, 0.25, **hints)


def test_kv_indices_buffers_too_small_are_named():
    with pytest.raises(ValueError, match="kv_indices must be int32"):
        mla_kv_indices(torch.zeros(3, 4, dtype=torch.int32), torch.ones(3, dtype=torch.int32), 16,
                       torch.zeros(4, dtype=torch.int32), torch.zeros(11, dtype=torch.int32))


def interpreter_checks() -> None:
    """The GPU tests' checks at tiny shapes on CPU tensors (run with TRITON_INTERPRET=1)."""
    for block in (4, 1, 5):
        check_kv_indices(DECODES + MIXED, block, "cpu")
    for cache_dtype, scale in ((F32, None), (F16, torch.tensor(2.0))):
        check_write(9, 4, 40, F32, cache_dtype, "cpu", scale)
    check_write(9, 4, 40, F32, BF16, "cpu", exact=False)
    small = [(9, 1), (23, 1), (1, 1), (40, 1)]
    mixed = [(9, 1), (21, 13), (1, 1), (7, 7), (30, 2)]
    for dtype in (F32, F16):
        for heads, r, rope in ((4, 24, 8), (16, 32, 16)):
            check_mla(small, heads, r, rope, 4, dtype, "cpu")
            check_mla(mixed, heads, r, rope, 5, dtype, "cpu", seed=1)
            check_mla(mixed, heads, r, rope, 1, dtype, "cpu", with_hints=False, seed=2)
    check_mla(mixed, 4, 512, 64, 16, F16, "cpu", seed=4)  # the real latent's tile configs
    check_mla(small, 4, 32, 16, 4, F16, "cpu", cache_dtype=FP8)
    check_mla(mixed, 4, 32, 16, 4, F16, "cpu", cache_dtype=FP8, seed=3)
    for block_h, splits in ((16, 1), (16, 3), (32, 8)):  # the split + merge path, some splits empty
        check_decode_config(small, 20, 32, 16, F32, "cpu", block_h, 16, 4, splits)
    check_e4m3_bits("cpu")
    for order in ("longest", "random"):  # any launch order, split or not
        for splits in (1, 3):
            check_decode_config(small, 20, 32, 16, F32, "cpu", 16, 16, 4, splits, order=order)
    # through the op: 17 sequences x 2 head groups > one wave (the interpreter counts 8 SMs: 16 slots)
    check_mla_order([(1 + 11 * i % 47, 1) for i in range(17)], 20, 32, 16, F32, "cpu")
    # the decode kernel's switches (1 split: up to 3 tiles a sequence); f8_bits gives the native upcast's bits
    for splits in (1, 3):
        check_decode_config(small, 20, 32, 16, F32, "cpu", 16, 16, 4, splits, prefetch=True)
    for prefetch in (False, True):
        native = check_decode_config(small, 20, 32, 16, F16, "cpu", 16, 16, 4, 1, FP8, prefetch=prefetch)
        bits = check_decode_config(small, 20, 32, 16, F16, "cpu", 16, 16, 4, 1, FP8, prefetch=prefetch, f8_bits=True)
        assert torch.equal(bits, native)
    print("interpreter checks passed")


@pytest.mark.slow
def test_kernels_under_the_interpreter():
    """The MLA kernels through Triton's CPU interpreter (a subprocess: TRITON_INTERPRET is read at import). The
    interpreter of triton 3.6 cannot run loops with runtime bounds under numpy >= 2.4."""
    run_under_interpreter("from tests.kernels.test_triton_mla import interpreter_checks; interpreter_checks()",
                          "interpreter checks passed")
