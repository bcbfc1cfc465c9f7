"""SGLang's own config objects → AtomConfig (atom_translate_config) and Platform (atom_platform).

Nothing here parses command lines: SGLang hands a model class its `hf_config` (already adjusted by
SGLang's ModelConfig, e.g. `context_len`), sets the model dtype as torch's default dtype while it
builds the model, and publishes its ServerArgs and parallel groups in `sglang.srt.runtime_context`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from atom_core.config import AtomConfig
from atom_core.platform import Platform, default_device
from atom_core.quantization import checkpoint_precision

HOST = "sglang"
# SGLang addresses its KV pool per token (req_to_token → slot), whatever its page size: one slot is
# one "block" of our paged-attention kernels.
SGLANG_BLOCK_SIZE = 1
# How to run the model without atom-core: appended to the errors of checkpoint_precision.
_FALLBACK = "; or unset SGLANG_EXTERNAL_MODEL_PACKAGE so SGLang uses its own model"


def _runtime():
    """(ServerArgs, ParallelContext) that SGLang published in this process; clear error if none."""
    from sglang.srt.runtime_context import get_parallel, get_server_args

    try:
        return get_server_args(), get_parallel()
    except ValueError as e:
        raise RuntimeError(
            "atom-core's SGLang frontend must run inside an SGLang engine process, which publishes its "
            "ServerArgs (sglang.srt.runtime_context.publish); none is published here. Start the model "
            "through sglang.Engine / sglang.launch_server with "
            "SGLANG_EXTERNAL_MODEL_PACKAGE=atom_frontends.sglang.models"
        ) from e


@dataclass(frozen=True)
class SGLangModelConfig:
    """The host_config our `atom_translate_config` accepts: what SGLang gives a model class."""

    hf_config: Any  # SGLang's ModelConfig.hf_config (a transformers PretrainedConfig)
    server_args: Any  # sglang.srt.server_args.ServerArgs, as SGLang published it
    dtype: torch.dtype  # ModelConfig.dtype (the default dtype SGLang set while building the model)
    quant_config: Any = None
    prefix: str = ""

    @classmethod
    def from_model_init(cls, hf_config: Any, quant_config: Any = None, prefix: str = "") -> SGLangModelConfig:
        """Inside a model class's __init__, as SGLang's loader calls it."""
        server_args, _ = _runtime()
        return cls(hf_config, server_args, torch.get_default_dtype(), quant_config, prefix)


def _max_model_len(c: SGLangModelConfig) -> int:
    # ModelConfig copies its resolved context length onto hf_config.context_len.
    for value in (getattr(c.hf_config, "context_len", None), getattr(c.server_args, "context_length", None),
                  getattr(c.hf_config, "max_position_embeddings", None)):
        if value:
            return int(value)
    return 2048


def extend_token_budget(server_args: Any, context_len: int) -> int:
    """The most tokens one SGLang prefill/extend step runs (sglang 0.5.23's PrefillAdder): with chunked prefill
    on, chunked_prefill_size caps every step (decodes mixed in included); with it off, the first request of a
    step goes whole (up to the context length) and later ones only within max_prefill_tokens."""
    chunk = getattr(server_args, "chunked_prefill_size", None) or 0
    if chunk > 0:
        return chunk
    return max(getattr(server_args, "max_prefill_tokens", None) or 0, context_len)


# SGLang's CPU path pads these to a multiple of its kernels' block (sglang.srt.configs.update_config, e.g. a 320-wide
# intermediate of an fp8 block checkpoint to 384), keeping the checkpoint's value as original_<name>.
_PADDED_SIZES = ("moe_intermediate_size", "intermediate_size", "intermediate_size_mlp",
                 "shared_expert_intermediate_size")


# ... and, when the heads do not divide by the TP size, pads the KV heads up to it (query heads alongside), keeping
# these: our layers split the checkpoint's heads (KV heads replicated when fewer than the ranks); the pool SGLang
# sizes from the padded count may then hold more KV heads per rank than ours, and the backend reads a slice of it.
_PADDED_HEADS = {"num_attention_heads": "original_num_attention_heads",
                 "num_key_value_heads": "original_total_num_kv_heads"}


def _checkpoint_sizes(hf_config: Any) -> Any:
    """hf_config with the checkpoint's own sizes where SGLang padded them (our layers take partial blocks): a copy,
    SGLang's object is left as SGLang made it."""
    originals = {name: getattr(hf_config, f"original_{name}", None) for name in _PADDED_SIZES}
    if not hasattr(hf_config, "kv_lora_rank"):  # MLA: one latent per token, no KV heads to pad
        originals |= {name: getattr(hf_config, original, None) for name, original in _PADDED_HEADS.items()}
    originals = {name: value for name, value in originals.items()
                 if value is not None and value != getattr(hf_config, name, None)}
    if not originals:
        return hf_config
    hf_config = copy.copy(hf_config)
    for name, value in originals.items():
        setattr(hf_config, name, value)
    return hf_config


def translate_config(c: SGLangModelConfig) -> AtomConfig:
    sa = c.server_args
    precision = checkpoint_precision(c.hf_config, c.dtype, getattr(sa, "kv_cache_dtype", None),
                                     host_quantization=c.quant_config, model=str(getattr(sa, "model_path", None)),
                                     fallback=_FALLBACK)
    max_model_len = _max_model_len(c)
    fields: dict[str, Any] = dict(
        hf_config=_checkpoint_sizes(c.hf_config), model_path=getattr(sa, "model_path", None), dtype=c.dtype,
        max_model_len=max_model_len, block_size=SGLANG_BLOCK_SIZE, kv_cache_dtype=precision.kv_cache_dtype,
        quantization=precision.quantization,
        tensor_parallel_size=getattr(sa, "tp_size", None) or 1,
        pipeline_parallel_size=getattr(sa, "pp_size", None) or 1,
        enforce_eager=bool(getattr(sa, "disable_cuda_graph", False)),
        max_num_batched_tokens=extend_token_budget(sa, max_model_len),
    )
    if getattr(sa, "max_running_requests", None):
        fields["max_num_seqs"] = sa.max_running_requests
    return AtomConfig(**fields)


def _device(name: str | None) -> torch.device:
    if not name:
        return default_device()
    if name == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(name)


def expert_parallel_layout(server_args: Any, parallel: Any) -> dict[str, Any]:
    """The Platform's expert-parallel fields from SGLang's MoE layout (--ep-size): ep_rank/ep_size are its
    moe_ep_rank/moe_ep_size (the rest of the TP group, moe_tp_size = tp_size // ep_size, splits each expert's
    intermediate dim), placement "linear" as SGLang's FusedMoE stores experts (rank r: [r * E/ep, (r+1) * E/ep)).
    What needs token dispatch between ranks is refused: MoE-DP, all-to-all backends, EPLB. Under DP attention the
    same layout spans the whole TP group (data_parallel.py)."""
    if parallel.moe_ep_size == 1:
        return {}
    sa = server_args
    refused = [name for name, on in (
        (f"moe_dp_size={parallel.moe_dp_size}", parallel.moe_dp_size > 1),
        (f"moe_a2a_backend={sa.moe_a2a_backend!r}", sa.moe_a2a_backend != "none"),
        ("EPLB / redundant experts", sa.enable_eplb or sa.ep_num_redundant_experts > 0)) if on]
    if refused:
        raise ValueError(f"SGLang's --ep-size {parallel.moe_ep_size} with {refused[0]}: atom-core's MoE layer splits "
                         "experts over the tensor-parallel ranks only (no token dispatch between data-parallel ranks, "
                         f"no redundant experts); run --tp-size N --ep-size M without it{_FALLBACK}")
    return dict(ep_rank=parallel.moe_ep_rank, ep_size=parallel.moe_ep_size, expert_placement="linear")


def _tensor_parallel_fields(parallel: Any) -> dict[str, Any]:
    """The Platform's tensor-parallel fields: SGLang's TP group and its collectives."""
    fields: dict[str, Any] = dict(tp_rank=parallel.tp_rank, tp_size=parallel.tp_size)
    if parallel.tp_size > 1:
        from sglang.srt.distributed import tensor_model_parallel_all_gather, tensor_model_parallel_all_reduce

        fields.update(all_reduce=tensor_model_parallel_all_reduce, all_gather=tensor_model_parallel_all_gather)
    return fields


def sglang_platform() -> Platform:
    """Device from ServerArgs; tensor parallelism through SGLang's own TP group; SGLang's expert-parallel layout
    (expert_parallel_layout). Under DP attention (data_parallel.py, attention-TP size 1) each rank runs the dense
    layers whole on its own tokens, and the MoE experts run over every DP rank's tokens."""
    from atom_frontends.sglang.data_parallel import data_parallel_fields

    server_args, parallel = _runtime()
    fields = data_parallel_fields(parallel) or _tensor_parallel_fields(parallel)
    return Platform(host=HOST, device=_device(getattr(server_args, "device", None)), **fields,
                    **expert_parallel_layout(server_args, parallel))
