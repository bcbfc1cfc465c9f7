"""A checkpoint's quantization and the KV-cache dtype: the one place every host's config translation asks.

Each frontend's `atom_translate_config` answer calls `checkpoint_precision` with what its host knows (the HF config,
the model dtype, the KV-cache dtype the user asked for, the host's own quantization object if it made one); the
AtomConfig it builds carries the result. Weights run unquantized today: a quantized checkpoint is refused here, by
name, rather than failing later on weights it cannot load (or running a config-only one unquantized).
"""

from __future__ import annotations

from typing import Any

import torch

# What our attention kernels store: the model dtype ("auto") or fp8 e4m3 with per-tensor scales.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
_FLOAT_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def checkpoint_precision(hf_config: Any, dtype: torch.dtype, kv_cache_dtype: str | None, *,
                         host_quantization: Any = None, model: str = "the model", fallback: str = "") -> str:
    """→ the AtomConfig.kv_cache_dtype for this checkpoint and request; raises ValueError for what atom-core cannot
    run. kv_cache_dtype: the host's name ("auto", "fp8", "fp8_e4m3", or a float type equal to `dtype`, which is
    "auto"); host_quantization: the host's quantization object (vLLM's/SGLang's quant_config) or None; fallback:
    the host's way to run the model without atom-core, appended to errors (e.g. "; or set ...")."""
    _refuse_quantized(hf_config, host_quantization, model, fallback)
    requested = kv_cache_dtype or "auto"
    if requested == _FLOAT_NAMES.get(dtype):
        return "auto"
    if requested not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={requested!r} is not supported by atom-core's attention (supported: "
                         f"{', '.join(KV_CACHE_DTYPES)}, or the model dtype); pick one of those{fallback}")
    return requested


def _refuse_quantized(hf_config: Any, host_quantization: Any, model: str, fallback: str) -> None:
    quant = getattr(hf_config, "quantization_config", None)
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", quant)
        raise ValueError(f"{model} is a quantized checkpoint (quant_method {method}): atom-core runs unquantized "
                         f"weights only; use a bf16/fp16/fp32 checkpoint (dequantize it first){fallback}")
    if host_quantization is not None:
        raise ValueError(f"quantized models ({type(host_quantization).__name__}) are not supported by atom-core "
                         f"yet; serve an unquantized checkpoint without a quantization option{fallback}")
