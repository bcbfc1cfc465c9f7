"""vLLM's CommonAttentionMetadata → the core's AttentionMetadata (the vLLM `atom_metadata_builder`).

No device copies: every tensor of the result is a view of one vLLM already holds on the device;
the prefill/decode counts come from the CPU-side query_start_loc_cpu (no device sync).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.attention.backend import AttentionCGSupport, AttentionMetadataBuilder, CommonAttentionMetadata

from atom_core.forward_context import AttentionMetadata
from atom_core.layers.attention import FULL_ATTENTION_OPS, MLA_OPS, metadata_builder_of
from atom_kernels import dispatch


def _positions(common: CommonAttentionMetadata, num_tokens: int) -> torch.Tensor:
    """common.positions when the runner set it, else derived on the device (no sync, no copy)."""
    if common.positions is not None:
        return common.positions[:num_tokens]
    qsl = common.query_start_loc
    q_lens = qsl[1:] - qsl[:-1]
    # token t of request r sits at position seq_lens[r] - (qsl[r+1] - t)
    req = torch.repeat_interleave(torch.arange(q_lens.shape[0], device=qsl.device), q_lens,
                                  output_size=num_tokens)
    t = torch.arange(num_tokens, device=qsl.device)
    return (common.seq_lens[req] - qsl[1:][req] + t).long()


def build_metadata(common: CommonAttentionMetadata) -> AttentionMetadata:
    """One vLLM batch (requests in vLLM's order; with our builder, decodes first) → AttentionMetadata
    over its real tokens only.

    vLLM pads a step's rows (CUDA graphs, data parallelism): the model's inputs have more rows than
    its requests' tokens. Under full CUDA graphs the metadata is padded too: num_actual_tokens counts
    the padding rows, padding requests have no tokens (query_start_loc repeats its last value), the
    padding rows' slots are -1. The real tokens are query_start_loc_cpu[-1] in every case; the
    result's slot_mapping and positions cover those (its num_tokens), the layer leaves the rest out.
    """
    qsl_cpu = common.query_start_loc_cpu
    n = int(qsl_cpu[-1])  # CPU tensor: no device sync
    return AttentionMetadata.from_query_lens(
        (qsl_cpu[1:] - qsl_cpu[:-1]).tolist(),  # padding requests: 0
        slot_mapping=common.slot_mapping[:n],
        block_tables=common.block_table_tensor,
        seq_lens=common.seq_lens,
        query_start_loc=common.query_start_loc,
        positions=_positions(common, n),
        max_seq_len=common.max_seq_len,
    )


class AtomMetadataBuilder(AttentionMetadataBuilder[AttentionMetadata]):
    """vLLM's per-KV-cache-group builder; the conversion itself is the builder attached to the group's layers."""

    @classmethod
    def get_cudagraph_support(cls, vllm_config: Any, kv_cache_spec: Any) -> AttentionCGSupport:
        """Full CUDA graphs of decode-only batches where atom_kernels' Triton kernels run attention: they
        never sync, size their grids from tensor shapes and the capture's hints (vLLM captures with
        max_seq_len = max_model_len, an upper bound they stay correct under), and skip the padding
        requests of a replay (query length 0); every tensor of our metadata is a view of the runner's
        persistent buffers. The torch reference reads CPU values (.tolist()): no full graphs, vLLM
        then captures only the pieces between attention ops (piecewise), or nothing."""
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        device = torch.device(vllm_config.device_config.device_type)
        ops = MLA_OPS if isinstance(kv_cache_spec, MLAAttentionSpec) else FULL_ATTENTION_OPS
        if all(dispatch.backend(op, device) == "triton" for op in ops):
            return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
        return AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # The builder the Attention factory attached to this KV-cache group's layers (build_metadata, above).
        layers = vllm_config.compilation_config.static_forward_context
        self._build = metadata_builder_of(layers[name] for name in layer_names)
        # Decodes (query length 1) first: vLLM reorders the batch so they lead.
        self._init_reorder_batch_threshold(1)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AttentionMetadata:
        return self._build(common_attn_metadata)
