"""Native host hooks: our own engine drives the process (inside NATIVE.scope())."""

from __future__ import annotations

from typing import Any

from atom_core.hookspecs import hookimpl
from atom_core.plugins import HostMarker

HOST = "native"
NATIVE = HostMarker(HOST)


@hookimpl
def atom_detect_host() -> str | None:
    return NATIVE.detect()


@hookimpl
def atom_platform():
    from atom_core.platform import Platform, default_device

    device = default_device()
    # A single process: tensor parallel size 1, collectives are identities.
    return Platform(host=HOST, device=device)


@hookimpl
def atom_translate_config(host_config: Any):
    from atom_frontends.native.engine_args import EngineArgs

    return host_config.to_atom_config() if isinstance(host_config, EngineArgs) else None


@hookimpl
def atom_metadata_builder(spec: Any):
    from atom_frontends.native.inputs import InputBuilder

    return InputBuilder


@hookimpl
def atom_attention_impl(spec: Any):
    from atom_frontends.native.attention import NativeAttention, NativeMLAAttention

    return NativeMLAAttention if spec.is_mla else NativeAttention
