"""The vLLM host: atom-core models and attention loaded by vLLM through its official plugin entry points.

Importing this package never imports vllm; the modules that need it (model, attention, backend,
metadata builder, platforms) are only loaded by vLLM itself, through the entry points in plugin.py.
Environment: ATOM_DISABLE_VLLM_PLUGIN=1 turns the whole plugin off (vLLM runs its own models).
"""

from __future__ import annotations

from atom_frontends.vllm.plugin import is_disabled

__all__ = ["is_disabled"]
