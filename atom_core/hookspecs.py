"""The pluggy hooks (project name "atom"): the core's questions to the frontends, each frontend's hooks.py answers.

The core calls every hook (see plugins.py for where); a frontend never calls one. atom_platform,
atom_attention_impl and atom_metadata_builder are asked of the current host's frontend alone (plugins.host_hooks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from atom_core.config import AtomConfig
    from atom_core.layers.attention_spec import AttentionSpec
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
    def atom_platform(self) -> Platform | None:
        """The Platform (device, dtypes, TP rank/size and collectives) of this frontend's host."""

    @hookspec(firstresult=True)
    def atom_translate_config(self, host_config: Any) -> AtomConfig | None:
        """An AtomConfig built from a host's own config object, by the frontend that recognises its type (the
        others answer None). Asked by atom_core.loader.build_model."""

    @hookspec(firstresult=True)
    def atom_attention_impl(self, spec: AttentionSpec) -> type | None:
        """The attention layer class this host's runner expects for a layer described by `spec` (MHA or MLA)."""

    @hookspec(firstresult=True)
    def atom_metadata_builder(self, spec: AttentionSpec) -> Callable[..., Any] | type | None:
        """What turns this host's batch into the one AttentionMetadata for layers of `spec`: the Attention factory
        attaches it to the layer it makes (`layer.metadata_builder`), where the host's runner/backend reads it."""
