"""AttentionForVllm as vLLM's runner uses it (forward-context registration, backend, KV-cache spec), its
attention call staying opaque under vLLM-style torch.compile (guards dropped, traced once), on steps vLLM
pads, and in vLLM's micro-batch threads (dual-batch overlap)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from tests.frontends.vllm.batch import (  # noqa: E402
    BLOCK,
    HEADS,
    KV_HEADS,
    PAD_MODES,
    PAD_TOKENS,
    REQUESTS,
    D,
    atom_builder,
    common_metadata,
    fill_step,
    pad_metadata,
    pad_rows,
    sdpa_reference,
    vllm_kv_cache,
    with_step_written,
)

PREFIX = "model.layers.0.self_attn.attn"


def _attention(cfg, prefix: str = PREFIX, **kwargs):
    """Through the core's Attention factory, as model code builds it, with the host marked vllm."""
    from vllm.config import set_current_vllm_config

    from atom_core.layers.attention import Attention
    from atom_frontends.vllm.hooks import VLLM

    with set_current_vllm_config(cfg), VLLM.scope():
        return Attention(HEADS, D, D**-0.5, KV_HEADS, prefix=prefix, **kwargs)


def test_layer_is_what_vllms_runner_looks_for():
    from vllm.config import VllmConfig, get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from atom_frontends.vllm.attention import AttentionForVllm
    from atom_frontends.vllm.backend import AtomAttentionBackend

    cfg = VllmConfig()
    layer = _attention(cfg)
    assert isinstance(layer, AttentionForVllm)
    assert get_layers_from_vllm_config(cfg, AttentionLayerBase) == {PREFIX: layer}
    assert layer.get_attn_backend() is AtomAttentionBackend
    assert AttentionBackendEnum[AtomAttentionBackend.get_name()].get_class() is AtomAttentionBackend
    assert layer.kv_cache.numel() == 0 and layer.num_heads == HEADS
    with pytest.raises(ValueError, match="duplicate attention layer name"):
        _attention(cfg)


@pytest.mark.parametrize("window", [None, 0, -1, 64])
def test_kv_cache_spec_full_or_sliding_window(window):
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    cfg = VllmConfig()
    cfg.cache_config.block_size = BLOCK
    spec = _attention(cfg, sliding_window=window).get_kv_cache_spec(cfg)
    assert (spec.block_size, spec.num_kv_heads, spec.head_size) == (BLOCK, KV_HEADS, D)
    if window and window > 0:
        assert type(spec) is SlidingWindowSpec and spec.sliding_window == window
    else:
        assert type(spec) is FullAttentionSpec and spec.sliding_window is None


def test_attention_stays_opaque_under_guard_free_compile():
    """vLLM compiles once with guards dropped, on a warm-up run without metadata. Our op must keep the
    'no metadata' branch out of the graph, or every later step would return the warm-up's zeros."""
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    from atom_frontends.vllm.metadata import build_metadata

    cfg = VllmConfig()
    layer = _attention(cfg)
    g = torch.Generator().manual_seed(3)
    common = common_metadata(g)
    layer.kv_cache = vllm_kv_cache()  # what vLLM's bind_kv_cache does
    query, key, value, k_all, v_all = fill_step(layer.kv_cache, common, g)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(layer, fullgraph=True, backend=capture,
                             options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe})
    with set_forward_context(None, cfg):  # warm-up / profiling: no metadata
        assert torch.count_nonzero(compiled(query, key, value)) == 0
    with set_forward_context({PREFIX: build_metadata(common)}, cfg):
        out = compiled(query, key, value)
    assert len(graphs) == 1  # one trace, reused: the second call ran the warm-up's graph
    torch.testing.assert_close(out, sdpa_reference(query, k_all, v_all, D**-0.5))
    op = torch.ops.atom.vllm_attention
    calls = [n for n in graphs[0].graph.nodes if n.target in (op, op.default)]
    assert len(calls) == 1 and PREFIX in calls[0].args


def _attend_through_op(query, key, value):
    """The layer's call (AttentionForVllm.forward) with its output rows NaN beforehand, not fresh memory
    that may happen to hold zeros: every row the op leaves alone shows."""
    output = torch.full_like(query, float("nan"))
    torch.ops.atom.vllm_attention(query, key, value, output, PREFIX)
    return output


def _layer_and_step(seed: int):
    """A vLLM config, our layer on a vLLM-layout cache holding the step's cached prefixes, the step
    (CommonAttentionMetadata, query/key/value, every request's K/V) and the cache as it must end up."""
    from vllm.config import VllmConfig

    cfg = VllmConfig()
    layer = _attention(cfg)
    g = torch.Generator().manual_seed(seed)
    common = common_metadata(g)
    layer.kv_cache = vllm_kv_cache()
    query, key, value, k_all, v_all = fill_step(layer.kv_cache, common, g)
    return cfg, layer, common, (query, key, value, k_all, v_all), with_step_written(layer.kv_cache, common, key, value)


@pytest.mark.parametrize("mode", PAD_MODES)
def test_padded_step_attends_real_rows_zeroes_padding_and_keeps_it_out_of_the_cache(mode):
    from vllm.forward_context import set_forward_context

    cfg, layer, common, (query, key, value, k_all, v_all), want_cache = _layer_and_step(5)
    md = atom_builder().build(0, pad_metadata(common, mode))
    with set_forward_context({PREFIX: md}, cfg):
        out = _attend_through_op(pad_rows(query), pad_rows(key), pad_rows(value))
    n = common.num_actual_tokens
    assert out.shape == (n + PAD_TOKENS, HEADS * D)
    torch.testing.assert_close(out[:n], sdpa_reference(query, k_all, v_all, D**-0.5))
    assert torch.count_nonzero(out[n:]) == 0  # padding rows: zeros (not the NaN inputs, not stale memory)
    assert torch.equal(layer.kv_cache, want_cache)  # this step's K/V at its slots, nothing else written
    with set_forward_context({PREFIX: md}, cfg), pytest.raises(ValueError, match="24 query rows for a batch of 25"):
        _attend_through_op(query[:-1], key[:-1], value[:-1])  # fewer rows than tokens: not this step's


@pytest.mark.parametrize("mode", PAD_MODES)
def test_qk_norm_rope_op_equals_norms_and_rotary_then_the_attention_op(mode):
    """Qwen3's prologue through atom::vllm_qk_norm_rope_attention on a padded step == the per-head norms and the
    rotary by the torch reference, then atom::vllm_attention on an identical layer and cache: same output, same
    cache, padding rows zero and kept out of the cache. The layer does not take the prologue while vLLM's CPU
    kernels serve the device (as on this platform, vLLM's page format); here they are removed for the test."""
    from vllm.forward_context import set_forward_context

    from atom_frontends.vllm.cpu_kernels import OPS
    from atom_kernels import dispatch, reference

    cfg, layer, common, (query, key, value, _, _), _ = _layer_and_step(7)
    plain_cfg, plain, _, _, _ = _layer_and_step(7)  # same seed: the same cache contents and step
    assert not layer.fuses_qk_norm_rope  # vLLM's CPU kernels own this platform's pages
    for op in OPS:  # (built layers registered them) atom_kernels' own kernels serve every op, in their page format
        dispatch.register(op, "provided", None)
    g = torch.Generator().manual_seed(8)
    n = common.num_actual_tokens
    q_weight, k_weight = torch.rand(D, generator=g) + 0.5, torch.rand(D, generator=g) + 0.5
    angles = torch.rand(64, D // 2, generator=g) * 6.3
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions = torch.cat([common.positions, common.positions.new_full((PAD_TOKENS,), 7)])
    q, k, v = query.view(n, HEADS, D), key.view(n, KV_HEADS, D), value.view(n, KV_HEADS, D)
    md = atom_builder().build(0, pad_metadata(common, mode))
    with set_forward_context({PREFIX: md}, cfg):
        out = layer.forward_qk_norm_rope(positions, *(pad_rows(x.reshape(n, -1)).view(n + PAD_TOKENS, -1, D)
                                                      for x in (q, k, v)), (q_weight, k_weight, 1e-6, cos_sin))
    qr, kr = reference.rotary(positions[:n], reference.rms_norm(q, q_weight, 1e-6),
                              reference.rms_norm(k, k_weight, 1e-6), cos_sin)
    with set_forward_context({PREFIX: md}, plain_cfg):
        want = torch.full_like(out, float("nan"))
        torch.ops.atom.vllm_attention(pad_rows(qr.reshape(n, -1)), pad_rows(kr.reshape(n, -1)), pad_rows(value),
                                      want, PREFIX)
    assert torch.equal(out[:n], want[:n]) and torch.count_nonzero(out[n:]) == 0
    assert torch.equal(layer.kv_cache, plain.kv_cache)
    assert not torch.equal(qr, q)  # the norms and rotary changed the query (the check above could fail)


def _run_like_ubatch_wrapper(cfg, ubatch_slices, attn_metadata, query, key, value):
    """One forward as vLLM's UBatchWrapper runs it under --enable-dbo: a forward context per micro-batch
    holding that micro-batch's metadata dict, and a thread per micro-batch running the model on its token
    rows (UBatchWrapper._make_ubatch_metadata and _run_ubatches, vLLM's own code). The wrapper's __init__
    and __call__ need CUDA streams, so it is made without __init__, given the fields those two read; its
    streams are None, which torch.cuda.set_stream ignores (a CPU build has no streams to switch)."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu_ubatch_wrapper import UBatchWrapper

    wrapper = UBatchWrapper.__new__(UBatchWrapper)
    wrapper.vllm_config, wrapper.comm_stream = cfg, None
    wrapper.ready_barrier = threading.Barrier(len(ubatch_slices) + 1)
    widths = [query.shape[1], key.shape[1], value.shape[1]]

    def model(input_ids, positions, intermediate_tensors, inputs_embeds):  # one micro-batch's rows
        return _attend_through_op(*inputs_embeds.split(widths, dim=1))

    rows = query.shape[0]
    ubatches = wrapper._make_ubatch_metadata(
        ubatch_slices=ubatch_slices, attn_metadata=attn_metadata, slot_mapping=None,
        input_ids=torch.zeros(rows, dtype=torch.long), positions=torch.arange(rows),
        inputs_embeds=torch.cat([query, key, value], dim=1), intermediate_tensors=None,
        compute_stream=None, dp_metadata=[None] * len(ubatch_slices), batch_descriptor=None,
        cudagraph_runtime_mode=CUDAGraphMode.NONE, is_padding=None)
    return wrapper._run_ubatches(ubatches, model)


def test_micro_batches_attend_in_their_own_forward_contexts():
    """Dual-batch overlap as vLLM 0.32 runs it for a backend without full CUDA graphs: the padded step
    split in two at row 15 (inside the 13-token prefill), metadata per micro-batch by vLLM's
    split_attn_metadata, the last micro-batch's rows padded beyond its metadata."""
    from vllm.forward_context import set_forward_context
    from vllm.v1.worker.ubatch_utils import maybe_create_ubatch_slices, split_attn_metadata

    cfg, layer, common, (query, key, value, k_all, v_all), want_cache = _layer_and_step(6)
    n = common.num_actual_tokens
    slices, padded_slices = maybe_create_ubatch_slices(True, np.array([q for _, q in REQUESTS]),
                                                       n + PAD_TOKENS, len(REQUESTS), 2)
    assert [s.token_slice for s in padded_slices] == [slice(0, 15), slice(15, n + PAD_TOKENS)]
    builder = atom_builder()
    attn_metadata = [{PREFIX: builder.build(0, part)} for part in split_attn_metadata(slices, common)]
    out = _run_like_ubatch_wrapper(cfg, padded_slices, attn_metadata,
                                   pad_rows(query), pad_rows(key), pad_rows(value))
    torch.testing.assert_close(out[:n], sdpa_reference(query, k_all, v_all, D**-0.5))
    assert torch.count_nonzero(out[n:]) == 0
    assert torch.equal(layer.kv_cache, want_cache)

    # The runner's own forward context holds the list; a layer run there, outside the micro-batch
    # threads, has the whole step's rows and no single metadata that fits them.
    with set_forward_context(attn_metadata, cfg, ubatch_slices=padded_slices):
        with pytest.raises(ValueError, match="enable-dbo"):
            layer(pad_rows(query), pad_rows(key), pad_rows(value))
