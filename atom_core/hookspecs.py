"""The pluggy hooks (project name "atom") that each frontend implements in its hooks.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from atom_core.config import AtomConfig
    from atom_core.layers.attention import AttentionSpec
    from atom_core.platform import Platform

PROJECT = "atom"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class AtomHookSpecs:
    # Not firstresult: every answer is collected so that two frontends claiming the
    # process is a clear error instead of a silent first-registered-wins.
    @hookspec
    def atom_detect_host(self) -> str | None:
        """This frontend's host name if that host drives the current process/scope, else None."""

    @hookspec(firstresult=True)
    def atom_platform(self, host: str) -> Platform | None:
        """The Platform (device, dtypes, TP rank/size and collectives) for `host`."""

    @hookspec(firstresult=True)
    def atom_translate_config(self, host: str, host_config: Any) -> AtomConfig | None:
        """An AtomConfig built from `host`'s own config object(s)."""

    @hookspec(firstresult=True)
    def atom_metadata_builder(self, host: str, spec: Any) -> Callable[..., Any] | None:
        """A builder turning `host`'s batch description into atom_core AttentionMetadata."""

    @hookspec(firstresult=True)
    def atom_attention_impl(self, host: str, spec: AttentionSpec) -> type | None:
        """The attention layer class `host`'s runner expects for a layer described by `spec`."""
