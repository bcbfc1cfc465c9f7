"""vLLM host hooks, asked by the core of this frontend alone when the host is "vllm"; the host is marked active
by our vLLM entry points (plugin.py), which vLLM runs in every one of its processes."""

from __future__ import annotations

from typing import Any

from atom_core.hookspecs import hookimpl
from atom_core.plugins import HostMarker

HOST = "vllm"
VLLM = HostMarker(HOST)


@hookimpl
def atom_detect_host() -> str | None:
    return VLLM.detect()


@hookimpl
def atom_platform():
    from atom_frontends.vllm.config import platform_from_vllm

    return platform_from_vllm()


@hookimpl
def atom_translate_config(host_config: Any):
    from atom_frontends.vllm.config import to_atom_config, vllm_config_class

    config_class = vllm_config_class()
    return to_atom_config(host_config) if config_class and isinstance(host_config, config_class) else None


@hookimpl
def atom_metadata_builder(spec: Any):
    from atom_frontends.vllm.metadata import build_metadata

    return build_metadata


@hookimpl
def atom_attention_impl(spec: Any):
    if spec.is_mla:
        from atom_frontends.vllm.mla import MLAAttentionForVllm

        return MLAAttentionForVllm
    from atom_frontends.vllm.attention import AttentionForVllm

    return AttentionForVllm
