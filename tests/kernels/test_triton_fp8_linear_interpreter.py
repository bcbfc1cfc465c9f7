"""The Triton block-scaled FP8 GEMM vs the torch reference (atom_kernels.reference.fp8: dequantize both sides, matmul
in float32) under Triton's CPU interpreter (CI has no GPU): partial K blocks, N and M not multiples of the tiles,
bias, bf16 and float32 inputs; weights only (no activation quantization) takes the reference (per-channel scales and
static input scales: test_triton_fp8_per_channel.py); the tile kernel's program groups (GROUP_M). The small-M GEMV
(fp8_gemv.py): split-K on and off at M = 1, 2, 5, 16, 17 and through fp8_linear at M up to 33, with canaries (a
neighbouring scale block, in K or in N, must fail). Marked gpu: DeepSeek-V3 and Qwen3-30B-A3B linear shapes
(benchmarks/fp8_gemm.py's) at M = 1, 8, 32 (the GEMV), 256 and 4096 (the tile kernel), bf16; the tile kernel's TMA
and pointer loads."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.interpreter import run_under_interpreter  # noqa: E402

GEMV_SPLITS = ((1, 3), (3, 1), (2, 2))  # (splits, K blocks per split) for a 3-block K


def interpreter_checks() -> None:
    import torch

    from atom_kernels.reference.fp8 import fp8_linear as reference
    from atom_kernels.triton.fp8_linear import fp8_linear

    torch.manual_seed(0)
    for m, n, k, dtype, bias in ((1, 64, 256, torch.float32, False), (5, 100, 320, torch.bfloat16, True),
                                 (33, 130, 200, torch.float32, True)):
        x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k)
        scale = torch.rand(n, -(-k // 128)) / 100 + 1e-3
        wq, b = w.to(torch.float8_e4m3fn), torch.randn(n) if bias else None
        got, want = fp8_linear(x, wq, scale, 128, 128, None, b), reference(x, wq, scale, 128, 128, None, b)
        assert got.dtype == dtype and got.shape == (m, n)
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        shifted = fp8_linear(x, wq, scale.roll(1, 1), 128, 128, None, b)  # the scales' blocks matter
        assert not torch.allclose(shifted.float(), want.float(), rtol=tol, atol=tol)
    from atom_kernels.triton.fp8_linear import gemm

    # 4 x 3 tiles of 16 x 32, a partial last K block; K = 304: TMA boxes (16-byte rows) or masked pointer loads
    x, wq = torch.randn(50, 304), torch.randn(70, 304).to(torch.float8_e4m3fn)
    scale = torch.rand(70, 3) / 100 + 1e-3
    want = reference(x, wq, scale, 128, 128)
    for group_m, tma in ((1, True), (3, False), (3, True), (8, True)):  # groups of 1, 3 (the last partial), all 4
        tiles = (16, 32, 4, 1, group_m)
        torch.testing.assert_close(gemm(x, wq, scale, 128, None, tiles, tma), want, rtol=1e-5, atol=1e-5)
        assert not _close(gemm(x, wq, scale.roll(1, 0), 128, None, tiles, tma), want, 1e-5)
    per_channel = torch.rand(64, 1)
    x, wq = torch.randn(3, 96), torch.randn(64, 96).to(torch.float8_e4m3fn)
    assert torch.equal(fp8_linear(x, wq, per_channel, 96, 0), reference(x, wq, per_channel, 96, 0))  # weights only
    print("interpreter checks passed")


def _close(got, want, tol) -> bool:
    import torch

    return torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)


def gemv_checks() -> None:
    """fp8_gemv (each split of GEMV_SPLITS, forced) and fp8_linear (its own choice) against the reference; the
    canaries shift the weight scales by one block along K and one row along N: the kernels must then miss the
    reference."""
    import torch

    from atom_kernels.reference.fp8 import fp8_linear as reference
    from atom_kernels.triton.fp8_gemv import fp8_gemv
    from atom_kernels.triton.fp8_linear import fp8_linear

    torch.manual_seed(0)
    for m, n, k, dtype, bias in ((1, 40, 300, torch.float32, False), (2, 64, 384, torch.float32, True),
                                 (5, 70, 260, torch.bfloat16, True), (16, 33, 320, torch.float32, False),
                                 (17, 100, 257, torch.float32, True)):
        x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k)  # K: 2-3 blocks, the last partial but at 384
        scale = torch.rand(n, -(-k // 128)) / 100 + 1e-3
        wq, b = w.to(torch.float8_e4m3fn), torch.randn(n) if bias else None
        want = reference(x, wq, scale, 128, 128, None, b)
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
        for splits, per in GEMV_SPLITS:
            cfg = dict(splits=min(splits, scale.shape[1]), per=per)
            got = fp8_gemv(x, wq, scale, 128, b, **cfg)
            assert got.dtype == dtype and got.shape == (m, n), (got.dtype, got.shape)
            torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda e, at=(m, n, k, cfg): f"{at}: {e}")
            for wrong in (scale.roll(1, 1), scale.roll(1, 0)):
                assert not _close(fp8_gemv(x, wq, wrong, 128, b, **cfg), want, tol), (m, n, k, cfg)
        torch.testing.assert_close(fp8_linear(x, wq, scale, 128, 128, None, b), want, rtol=tol, atol=tol)
    for m in (17, 33):  # fp8_linear's own choice: 17 the GEMV (no split at this size), 33 the tile GEMM
        x, wq = torch.randn(1, m, 600), torch.randn(50, 600).to(torch.float8_e4m3fn)
        scale = torch.rand(50, 5) / 100 + 1e-3
        want = reference(x, wq, scale, 128, 128)
        torch.testing.assert_close(fp8_linear(x, wq, scale, 128, 128), want, rtol=1e-5, atol=1e-5)
        assert not _close(fp8_linear(x, wq, scale.roll(1, 1), 128, 128), want, 1e-5)
    x, wq = torch.randn(3, 80), torch.randn(24, 80).to(torch.float8_e4m3fn)  # 16-column blocks: the float16 dot
    scale = torch.rand(24, 5) / 100 + 1e-3
    got = fp8_gemv(x, wq, scale, 16, None, splits=2, per=3)
    torch.testing.assert_close(got, reference(x, wq, scale, 16, 16), rtol=1e-5, atol=1e-5)
    from atom_kernels.triton.fp8_gemv import _counters

    assert not _counters(x.device).any()  # every split-K launch left its counters zeroed for the next one
    print("gemv checks passed")


def cublas_layout_checks() -> None:
    """What of the cuBLAS path (fp8_cublas.py) a CPU can check: the quantizer's M-major scales (bit-equal to the
    row-major ones, strides (1, M) at M = 1 too), the weight's block scales derived from the per-row layout, both
    accepted by torch's own shape and stride checks of the blockwise scaled_mm (its meta kernel: N a multiple of 128)
    and a row-major activation scale or an unpadded weight scale refused; path() never picks cuBLAS off CUDA (no
    probe runs), and block_n changes nothing there."""
    import torch

    from atom_kernels.triton import fp8_cublas
    from atom_kernels.triton.fp8_linear import fp8_linear, path
    from atom_kernels.triton.fp8_quant import fp8_quantize_rows

    torch.manual_seed(0)
    for m, k in ((1, 256), (5, 128), (70, 768)):
        x = torch.randn(m, k, dtype=torch.bfloat16) * 3
        (q, s), (q_m, s_m) = fp8_quantize_rows(x, 128), fp8_quantize_rows(x, 128, m_major=True)
        assert s_m.stride() == (1, m) and s.stride() == (k // 128, 1), (s_m.stride(), s.stride())
        assert torch.equal(s_m, s) and torch.equal(q_m.float(), q.float())
    n, k, kb = 384, 768, 6  # 6 K blocks: padded to 8 for cuBLAS
    blocks = torch.rand(3, kb) + 0.5
    rows = blocks.repeat_interleave(128, 0)
    scale_b = fp8_cublas.block_scales(rows)
    assert scale_b.shape == (8, 3) and scale_b.stride() == (1, 8), (scale_b.shape, scale_b.stride())
    assert torch.equal(scale_b[:kb], blocks.t()) and not scale_b[kb:].any()
    assert fp8_cublas.block_scales(rows[:100, :4]).stride() == (1, 4)  # one block of rows: strides still (1, L4)
    wq = torch.randn(n, k).to(torch.float8_e4m3fn)
    meta = {name: t.to("meta") for name, t in dict(xq=q_m, xs=s_m, w=wq, sb=scale_b, xs_rows=s).items()}
    y = fp8_cublas.scaled_mm(meta["xq"], meta["xs"], meta["w"], meta["sb"], None, torch.bfloat16)
    assert y.shape == (70, n) and y.dtype == torch.bfloat16
    for xs, sb in ((meta["xs_rows"], meta["sb"]), (meta["xs"], meta["sb"][:kb])):
        try:
            fp8_cublas.scaled_mm(meta["xq"], xs, meta["w"], sb, None, torch.bfloat16)
        except RuntimeError:
            continue
        raise AssertionError(f"torch's checks took scale_a strides {xs.stride()}, scale_b {tuple(sb.shape)}")
    x, scale = torch.randn(64, k, dtype=torch.bfloat16), rows
    assert path(x, wq, 128, None, 128) == path(x, wq, 128, None, 0) == "tile" and not fp8_cublas._SUPPORT
    assert path(x[:32], wq, 128, None, 128) == "gemv"
    assert torch.equal(fp8_linear(x, wq, scale, 128, 128, None, None, 128), fp8_linear(x, wq, scale, 128, 128))
    print("cublas layout checks passed")


def test_block_scaled_fp8_gemm_under_the_interpreter():
    code = "from tests.kernels.test_triton_fp8_linear_interpreter import interpreter_checks; interpreter_checks()"
    run_under_interpreter(code, "interpreter checks passed")


def test_small_m_fp8_gemv_under_the_interpreter():
    code = "from tests.kernels.test_triton_fp8_linear_interpreter import gemv_checks; gemv_checks()"
    run_under_interpreter(code, "gemv checks passed")


def test_cublas_path_layouts_under_the_interpreter():
    code = "from tests.kernels.test_triton_fp8_linear_interpreter import cublas_layout_checks; cublas_layout_checks()"
    run_under_interpreter(code, "cublas layout checks passed")


SHAPES = {  # benchmarks/fp8_gemm.py's layers: (N, K)
    "dsv3 fused_qkv_a": (2112, 7168), "dsv3 q_b": (24576, 1536), "dsv3 o": (7168, 16384),
    "dsv3 mlp gate_up": (36864, 7168), "dsv3 mlp down": (7168, 18432), "dsv3 shared gate_up": (4096, 7168),
    "dsv3 shared down": (7168, 2048), "qwen3-30b-a3b qkv": (5120, 2048), "qwen3-30b-a3b o": (2048, 4096),
    "qwen3-30b-a3b expert gate_up": (1536, 2048), "qwen3-30b-a3b expert down": (2048, 768)}


def _gpu_case(m: int, n: int, k: int):
    """bf16 x [m, k]; e4m3 weight [n, k] with 128x128 block scales (amax / 448, as the releases quantize) repeated
    over each block's rows ([n, k / 128], the layout atom-core's layers pass); the reference's bf16 output."""
    import torch

    from atom_kernels.reference.fp8 import fp8_linear as reference
    from tests.fp8_checkpoints import quantize

    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    w = torch.randn(n, k, device="cuda", generator=g) * k**-0.5
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    wq, block_scale, _ = quantize(w, "block")  # the checkpoints' block quantization; block_scale [nb, kb]
    scale = block_scale.repeat_interleave(128, 0)[:n].contiguous()  # [n, kb]
    return x, wq, scale, reference(x, wq, scale, 128, 128)


def _assert_matches(got, want) -> None:
    """bf16 outputs: within 1% of the reference in relative L2, every row within 3%. On the H200 against a float64
    reference: the reference's bf16 rounding alone 0.17%, ours 0.25-0.42% over these shapes and 0.67% at the one-row,
    1536-column case (Hopper's e4m3 MMAs accumulate with fewer bits, as tests/kernels/test_triton_fp8_moe.py says),
    and the worst of 0.5M elements 1.1% of the output's largest; a misplaced scale block is off by tens of percent
    in whole rows."""
    import torch

    diff, ref = got.float() - want.float(), want.float()
    rel_l2 = (diff.norm() / ref.norm()).item()
    rows = (diff.norm(dim=-1) / ref.norm(dim=-1).clamp(min=1e-30)).max().item()
    assert rel_l2 <= 1e-2 and rows <= 3e-2, (rel_l2, rows)
    assert got.dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32, 256, 4096])
@pytest.mark.parametrize("layer", list(SHAPES))
def test_fp8_linear_model_shapes_on_gpu(layer, m):
    import torch

    from atom_kernels.triton.fp8_linear import fp8_linear

    n, k = SHAPES[layer]
    x, wq, scale, want = _gpu_case(m, n, k)
    _assert_matches(fp8_linear(x, wq, scale, 128, 128), want)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [False, True])
def test_fp8_tile_gemm_load_paths_on_gpu(tma):
    """The tile kernel's TMA loads and its masked pointer loads (K not a multiple of 16 takes them), partial tiles."""
    from atom_kernels.triton.fp8_linear import gemm

    x, wq, scale, want = _gpu_case(300, 2112, 7168)
    _assert_matches(gemm(x, wq, scale, 128, None, tma=tma), want)
    with pytest.raises(AssertionError):
        _assert_matches(gemm(x, wq, scale.roll(1, 1), 128, None, tma=tma), want)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32, 256])
def test_fp8_linear_misplaced_scale_block_fails_on_gpu(m):
    from atom_kernels.triton.fp8_linear import fp8_linear

    x, wq, scale, want = _gpu_case(m, 2112, 7168)
    with pytest.raises(AssertionError):
        _assert_matches(fp8_linear(x, wq, scale.roll(1, 1), 128, 128), want)
    with pytest.raises(AssertionError):  # a neighbouring 128-row block's scales
        _assert_matches(fp8_linear(x, wq, scale.roll(128, 0), 128, 128), want)


def _cublas_support(dtype=None):
    """fp8_cublas' probe on this GPU (printed): on Hopper with torch's F.scaled_mm it must have found the blockwise
    GEMM; elsewhere (torch runs it on sm_90 only) the test skips."""
    import torch
    import torch.nn.functional as F

    from atom_kernels.triton import fp8_cublas

    found = fp8_cublas.support(torch.device("cuda"), dtype or torch.bfloat16)
    print(f"cuBLAS blockwise GEMM, {dtype or torch.bfloat16}: {found}")
    if torch.cuda.get_device_capability()[0] != 9 or not hasattr(F, "scaled_mm"):
        pytest.skip(f"torch's blockwise scaled_mm runs on sm_90 only (and torch >= 2.10): {found.note}")
    return found


@pytest.mark.gpu
def test_cublas_blockwise_gemm_is_found_on_hopper():
    found = _cublas_support()
    assert found.aligned, found.note


@pytest.mark.gpu
@pytest.mark.parametrize("m", [40, 64, 256, 4096])
@pytest.mark.parametrize("layer", list(SHAPES))
def test_fp8_linear_cublas_path_model_shapes_on_gpu(layer, m):
    """block_n = 128 (whole 128-row blocks, as these weights are) at M >= cublas_min_m(K): fp8_linear takes cuBLAS
    (N with a partial last block only where the probe passed it), matches the reference as the tile kernel does, and
    its output is cuBLAS' bits (cublas_linear called directly), not the tile kernel's; below, the tile kernel's."""
    import torch

    import atom_kernels
    from atom_kernels.triton.fp8_cublas import cublas_linear
    from atom_kernels.triton.fp8_linear import cublas_min_m, gemm, path

    found = _cublas_support()
    n, k = SHAPES[layer]
    x, wq, scale, want = _gpu_case(m, n, k)
    fits = found.aligned and (n % 128 == 0 or found.partial_n)
    expected = "cublas" if fits and m >= cublas_min_m(k) else "tile"
    assert path(x, wq, 128, None, 128) == expected, found
    assert path(x, wq, 128, None, 0) == "tile"  # rows not known to be whole blocks: the tile kernel
    got = atom_kernels.fp8_linear(x, wq, scale, 128, 128, None, None, 128)
    _assert_matches(got, want)
    if expected == "cublas":
        assert torch.equal(got, cublas_linear(x, wq, scale, None))
        assert not torch.equal(got, gemm(x, wq, scale, 128, None))
    else:
        assert torch.equal(got, gemm(x, wq, scale, 128, None))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 4096])
def test_cublas_path_misplaced_scale_block_fails_on_gpu(m):
    """Canary: scales shifted by one 128-column block, or by one 128-row block (still block-structured rows), on
    the cuBLAS path must miss the reference."""
    import atom_kernels
    from atom_kernels.triton.fp8_linear import path

    assert _cublas_support().aligned
    x, wq, scale, want = _gpu_case(m, 4096, 7168)
    assert path(x, wq, 128, None, 128) == "cublas"
    for wrong in (scale.roll(1, 1), scale.roll(128, 0)):
        with pytest.raises(AssertionError):
            _assert_matches(atom_kernels.fp8_linear(x, wq, wrong, 128, 128, None, None, 128), want)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 256])
def test_cublas_path_bias_on_gpu(m):
    """A bf16 bias: cuBLAS' epilogue when the probe found it adding before the one rounding (the reference adds it
    in float32 and rounds once), else the tile kernel; either way within the reference's tolerance."""
    import torch

    import atom_kernels
    from atom_kernels.reference.fp8 import fp8_linear as reference
    from atom_kernels.triton import fp8_cublas
    from atom_kernels.triton.fp8_linear import path

    found = _cublas_support()
    assert found.aligned, found.note
    x, wq, scale, _ = _gpu_case(m, 4096, 7168)
    bias = torch.randn(4096, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).bfloat16()
    want = reference(x, wq, scale, 128, 128, None, bias)
    assert path(x, wq, 128, bias, 128) == ("cublas" if found.bias else "tile")
    assert path(x, wq, 128, bias.float(), 128) == "tile"  # a bias cuBLAS would have to round first
    got = atom_kernels.fp8_linear(x, wq, scale, 128, 128, None, bias, 128)
    _assert_matches(got, want)
    if found.bias:
        assert torch.equal(got, fp8_cublas.cublas_linear(x, wq, scale, bias))
    assert fp8_cublas._bias_rounds_once(torch.device("cuda"), torch.bfloat16) == found.bias


@pytest.mark.gpu
def test_cublas_path_fp16_and_float32_on_gpu():
    """fp16 takes cuBLAS where the probe passed it (else the tile kernel), within 1% of the reference in relative
    L2; float32 activations always keep the tile kernel (cuBLAS would round the output to 16 bits)."""
    import torch

    import atom_kernels
    from atom_kernels.reference.fp8 import fp8_linear as reference
    from atom_kernels.triton.fp8_linear import path

    found = _cublas_support(torch.float16)
    x, wq, scale, _ = _gpu_case(256, 4096, 7168)
    for dtype, expected in ((torch.float16, "cublas" if found.aligned else "tile"), (torch.float32, "tile")):
        xd = x.to(dtype)
        assert path(xd, wq, 128, None, 128) == expected, (dtype, found)
        got = atom_kernels.fp8_linear(xd, wq, scale, 128, 128, None, None, 128)
        want = reference(xd, wq, scale, 128, 128)
        assert got.dtype == dtype
        assert (got.float() - want.float()).norm() <= 1e-2 * want.float().norm()


@pytest.mark.gpu
def test_cublas_path_replays_in_a_cuda_graph_on_gpu():
    """Captured once (the probe ran before, eagerly), replayed on new activations: cuBLAS' eager bits."""
    import torch

    import atom_kernels
    from atom_kernels.triton.fp8_linear import path

    assert _cublas_support().aligned
    x, wq, scale, _ = _gpu_case(256, 4096, 7168)
    assert path(x, wq, 128, None, 128) == "cublas"
    static = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch's CUDA-graph recipe does
        atom_kernels.fp8_linear(static, wq, scale, 128, 128, None, None, 128)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = atom_kernels.fp8_linear(static, wq, scale, 128, 128, None, None, 128)
    fresh = torch.randn_like(x)
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, atom_kernels.fp8_linear(fresh, wq, scale, 128, 128, None, None, 128))
