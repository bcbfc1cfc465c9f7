"""Spy of test_warmup_engine.py, imported at start-up by every Python process that has this folder on PYTHONPATH
(the test puts it there for the processes sglang.Engine spawns: its scheduler runs our model and backend).

With $ATOM_WARMUP_SPY_LOG set, it wraps kernel_warmup's warm_up and the attention ops our
SGLang backend serves with, before anything imports them (`from ... import` then binds the wrappers), and appends
one JSON line per call (warm_up: per attention layer, and per model) to that file; each wrapper then calls the real
function. Cache views are logged by storage
address, offset, shape, strides and dtype, so the test can tell whether warm-up and serving read the same memory.
"""

from __future__ import annotations

import json
import os

LOG = os.environ.get("ATOM_WARMUP_SPY_LOG")


def _log(**event) -> None:
    with open(LOG, "a") as f:
        f.write(json.dumps(event) + "\n")


def _views(caches) -> list:
    return [[c.untyped_storage().data_ptr(), c.storage_offset(), list(c.shape), list(c.stride()), str(c.dtype)]
            for c in caches]


def _install() -> None:
    from atom_core.layers import attention, kernel_warmup
    from atom_core.layers.moe import MoE

    real_attention, real_mla = attention.attention_forward, attention.mla_forward
    real_warm_up = kernel_warmup.warm_up

    def warm_up(dtype, max_model_len, max_tokens, *, model=None, attention=()):
        attention = list(attention)
        for layer in attention:
            _log(event="warm_attention", layer=layer.spec.prefix, mla=layer.spec.is_mla, caches=_views(layer.caches),
                 dtype=str(dtype), bounds=[max_model_len, max_tokens],
                 scales=[layer.k_scale is not None, layer.v_scale is not None])
        if model is not None:
            _log(event="warm_moe", moe_layers=sum(isinstance(m, MoE) for m in model.modules()), dtype=str(dtype),
                 max_tokens=max_tokens)
        return real_warm_up(dtype, max_model_len, max_tokens, model=model, attention=attention)

    def attention_forward(spec, query, key, value, k_cache, v_cache, *args, **kwargs):
        _log(event="serve", layer=spec.prefix, caches=_views((k_cache, v_cache)))
        return real_attention(spec, query, key, value, k_cache, v_cache, *args, **kwargs)

    def mla_forward(spec, query, latent, cache, *args, **kwargs):
        _log(event="serve", layer=spec.prefix, caches=_views((cache,)))
        return real_mla(spec, query, latent, cache, *args, **kwargs)

    attention.attention_forward, attention.mla_forward = attention_forward, mla_forward
    kernel_warmup.warm_up = warm_up


if LOG:
    _install()
