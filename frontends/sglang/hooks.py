"""SGLang host hooks. Imports nothing from SGLang at module level: the plugin manager loads this
module in every process, with or without SGLang installed.

The host is marked active process-wide by the `sglang.srt.plugins` entry point (plugin.py), and
per scope by the model wrapper while it builds or runs a model (`SGLANG.scope()`).
"""

from __future__ import annotations

from typing import Any

from atom_core.hookspecs import hookimpl
from atom_core.plugins import HostMarker

HOST = "sglang"
SGLANG = HostMarker(HOST)


@hookimpl
def atom_detect_host() -> str | None:
    return SGLANG.detect()


@hookimpl
def atom_platform():
    from atom_frontends.sglang.config import sglang_platform

    return sglang_platform()


@hookimpl
def atom_translate_config(host_config: Any):
    from atom_frontends.sglang.config import SGLangModelConfig, translate_config

    return translate_config(host_config) if isinstance(host_config, SGLangModelConfig) else None


@hookimpl
def atom_metadata_builder(spec: Any):
    from atom_frontends.sglang.metadata import build_metadata

    return build_metadata


@hookimpl
def atom_attention_impl(spec: Any):
    from atom_frontends.sglang.attention import SGLangAttention, SGLangMLAAttention

    return SGLangMLAAttention if spec.is_mla else SGLangAttention
