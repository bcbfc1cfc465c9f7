"""The native host: atom-core's own small engine."""

from __future__ import annotations

__all__ = ["LLM", "LLMEngine", "EngineArgs", "SamplingParams", "RequestOutput"]


def __getattr__(name: str):
    # Lazy so that `atom_frontends.native.hooks` (loaded by the plugin manager) stays cheap.
    if name == "LLM":
        from atom_frontends.native.llm import LLM

        return LLM
    if name == "LLMEngine":
        from atom_frontends.native.engine import LLMEngine

        return LLMEngine
    if name == "EngineArgs":
        from atom_frontends.native.engine_args import EngineArgs

        return EngineArgs
    if name == "SamplingParams":
        from atom_frontends.native.sampling_params import SamplingParams

        return SamplingParams
    if name == "RequestOutput":
        from atom_frontends.native.request import RequestOutput

        return RequestOutput
    raise AttributeError(f"module 'atom_frontends.native' has no attribute {name!r}")
