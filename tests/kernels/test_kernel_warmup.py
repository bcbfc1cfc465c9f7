"""The warm-up shapes each Triton kernel module states (warm_up_shapes) reach every compiled variant the kernels
pick, whatever the batch: each prefill tile bucket (with and without decodes beside it) and each decode split class
(split or not, merge width), for full attention and MLA, over head layouts, dtypes and length bounds; each MoE path,
tile config and alignment chunk for any token count. The launch configs are the kernels' own functions (pure
Python), so a new bucket rule the shapes miss fails here; the GPU test (tests/frontends/native/test_gpu_warmup.py)
checks that no compilation happens in serving after the warm-up. And kernel_warmup.warm_up, the one entry, walks
them."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from atom_core.layers.kernel_warmup import AttentionCaches, warm_up  # noqa: E402
from atom_kernels import dispatch  # noqa: E402
from atom_kernels.triton import attention, mla, moe  # noqa: E402
from atom_kernels.triton._utils import pow2  # noqa: E402
from atom_kernels.triton.attention.decode import decode_config  # noqa: E402
from atom_kernels.triton.attention.prefill import prefill_config  # noqa: E402
from atom_kernels.triton.mla.decode import mla_decode_config  # noqa: E402
from atom_kernels.triton.mla.prefill import mla_prefill_config  # noqa: E402
from atom_kernels.triton.moe import moe_config  # noqa: E402
from atom_kernels.triton.moe.align import CHUNK, SMALL_CHUNKS  # noqa: E402

DEVICE = torch.device("cpu")  # the configs only ask the device for its SM count
BOUNDS = [(256, 8192), (3000, 96), (32768, 8192), (2048, 1), (512, 7)]  # (max_model_len, max_num_batched_tokens)


def _prefill_class(kind, q_len, skip_decodes, heads, kv_heads, dtype):
    if kind == "mla":
        return tuple(mla_prefill_config(q_len, heads, 512, dtype).items()), skip_decodes
    return tuple(prefill_config(q_len, 128, dtype == torch.float32, heads // kv_heads).items()), skip_decodes


def _decode_class(kind, num_seqs, hint, heads, kv_heads, dtype):
    if kind == "mla":
        cfg = mla_decode_config(num_seqs, heads, hint, DEVICE, dtype, dtype, dtype != torch.float32)
    else:
        cfg = decode_config(num_seqs, kv_heads, hint, 128, DEVICE, dtype, dtype)
    splits = cfg.pop("num_splits")
    return tuple(cfg.items()), splits > 1, pow2(splits)  # the kernel's SPLIT and the merge's S_PAD


def _warm_classes(kind, bounds, heads, kv_heads, dtype):
    prefill, decode = set(), set()
    shapes = (mla if kind == "mla" else attention).warm_up_shapes
    for q_lens, _, hint in shapes(*bounds):
        if max(q_lens) > 1:
            prefill.add(_prefill_class(kind, max(q_lens), 1 in q_lens, heads, kv_heads, dtype))
        if 1 in q_lens:
            decode.add(_decode_class(kind, len(q_lens), hint, heads, kv_heads, dtype))
    return prefill, decode


@pytest.mark.parametrize("kind, heads, kv_heads", [("full", 16, 8), ("full", 32, 8), ("full", 8, 8), ("full", 28, 4),
                                                   ("full", 64, 1), ("mla", 16, 1), ("mla", 128, 1), ("mla", 3, 1)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bounds", BOUNDS, ids=str)
def test_warm_up_batches_reach_every_variant(kind, heads, kv_heads, dtype, bounds):
    max_model_len, max_tokens = bounds
    warm_prefill, warm_decode = _warm_classes(kind, bounds, heads, kv_heads, dtype)
    rng = random.Random(0)
    top = min(max_model_len, max_tokens)
    for q_len in range(2, top + 1):
        for skip in (False, True):
            assert _prefill_class(kind, q_len, skip, heads, kv_heads, dtype) in warm_prefill, (q_len, skip)
    for _ in range(400):  # decodes of any batch size (alone or beside prefills) and any context bound
        num_seqs, hint = rng.randint(1, 512), rng.randint(1, max_model_len)
        assert _decode_class(kind, num_seqs, hint, heads, kv_heads, dtype) in warm_decode, (num_seqs, hint)


def _moe_class(tokens, top_k, experts, dtype):
    cfg = moe_config(tokens, top_k, experts, dtype)
    pairs = tokens * top_k
    one_program = -(-pairs // CHUNK) <= SMALL_CHUNKS
    return repr(cfg), cfg.get("gemv", False) or (one_program, min(CHUNK, pow2(pairs, 16)) if one_program else None)


@pytest.mark.parametrize("top_k, experts", [(8, 128), (6, 64), (2, 8), (1, 4), (8, 256), (3, 7)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("max_tokens", [8192, 96, 1, 3000])
def test_moe_warm_up_token_counts_reach_every_variant(top_k, experts, dtype, max_tokens):
    warm = {_moe_class(t, top_k, experts, dtype) for t in moe.warm_up_shapes(max_tokens)}
    for t in range(1, max_tokens + 1):
        assert _moe_class(t, top_k, experts, dtype) in warm, t


def test_no_warm_up_where_kernels_do_not_compile(checkpoint_factory):
    """The torch reference and the CPU kernels compile nothing and state no shapes: the warm-up runs nothing there."""
    from atom_core.layers.attention import AttentionSpec
    from atom_core.layers.moe import MoE
    from atom_frontends.native import LLM

    cpu = torch.device("cpu")
    assert dispatch.warm_up_shapes("paged_attention", cpu) is dispatch.warm_up_shapes("fused_moe", cpu) is None
    spec = AttentionSpec(4, 16, 0.25, 2, prefix="model.layers.0.self_attn.attn")
    cache = torch.zeros(4, 16, 2, 16)
    model = LLM(str(checkpoint_factory("Qwen3MoeForCausalLM")), num_kv_blocks=16).engine.model
    assert any(isinstance(m, MoE) for m in model.modules())
    assert warm_up(torch.float32, 512, 64, model=model, attention=[AttentionCaches(spec, (cache, cache))]) == 0


def test_the_entry_walks_the_kernels_shapes(monkeypatch):
    """Where a kernel states shapes (Triton on a GPU; here the torch reference made to state some), warm_up runs the
    layer once per shape, and once per process for layers of one shape."""
    import atom_kernels.reference
    from atom_core.layers.attention import AttentionSpec

    monkeypatch.setattr(atom_kernels.reference, "warm_up_shapes", attention.warm_up_shapes, raising=False)
    spec = AttentionSpec(4, 16, 0.25, 2, prefix="model.layers.0.self_attn.attn")
    cache = torch.zeros(4, 16, 2, 16)
    layers = [AttentionCaches(spec, (cache, cache)), AttentionCaches(spec, (cache, cache))]
    want = len(attention.warm_up_shapes(100, 40))
    assert want > 10
    assert warm_up(torch.float32, 100, 40, attention=layers) == want
    assert warm_up(torch.float32, 100, 40, attention=layers) == 0
