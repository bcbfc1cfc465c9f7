"""Every environment variable atom-core reads, in one place: its name, default, parser and meaning.

Read `atom_kernels.envs.NAME` (e.g. `envs.ATOM_KERNEL_BACKEND`): the value is parsed from the environment at each
access, so a test's monkeypatch or a process's late `os.environ[...] = ...` is seen. The module lives in
atom_kernels, the bottom of the dependency chain (kernels <- core <- frontends), so that the kernels, the core and
the frontends all read their variables here without a kernel module importing atom_core.

Switches here only supply defaults: the decision is a config field (AtomConfig.fused_qk_norm_rope,
AtomConfig.persistent_mla_decode_metadata, EngineArgs.overlap_scheduling) that code reads, and that an explicit
argument overrides. Variables marked "debug" exist to isolate a problem, not to tune a deployment.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def parse_bool(name: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: use 1/0, true/false, yes/no or on/off")


def parse_names(name: str, value: str) -> frozenset[str] | None:
    """'a, b' → {'a', 'b'}; blank → None (no list given)."""
    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    return names or None


def parse_positive_int(name: str, value: str) -> int:
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{name}={value!r}: use a whole number of at least 1")
    return int(value)


def parse_str(name: str, value: str) -> str | None:
    return value.strip() or None


@dataclass(frozen=True)
class Variable:
    default: Any  # the value when the variable is unset
    parse: Callable[[str, str], Any]  # (name, raw text) → value; raises ValueError naming the variable
    meaning: str


VARIABLES: dict[str, Variable] = {
    # Hosts and frontends (atom_core.plugins)
    "ATOM_HOST": Variable(None, parse_str, "force the host (native, vllm, sglang) instead of asking the frontends"),
    "ATOM_FRONTENDS": Variable(None, parse_names, "comma-separated frontends to load; unset: all of them"),
    "ATOM_DISABLE_FRONTENDS": Variable(None, parse_names, "comma-separated frontends never to load"),
    "ATOM_TRACE_HOOKS": Variable(False, parse_bool, "debug: log every hook call and its answer"),
    # Kernels (atom_kernels)
    "ATOM_KERNEL_BACKEND": Variable(None, parse_str, "force one kernel backend (host, triton, torch) for every op "
                                                     "that has it on its device; unset: the best available"),
    "ATOM_PDL": Variable(True, parse_bool, "programmatic dependent launch of the Triton kernels on NVIDIA GPUs of "
                                           "compute capability >= 9; debug: 0 turns it off"),
    "ATOM_PDL_PREFETCH": Variable(True, parse_bool, "the FP8 decode GEMV asks L2 for its first weight tiles while "
                                                    "it waits on the kernel before it (with ATOM_PDL); 0 turns it "
                                                    "off (A/B)"),
    # Defaults of config fields
    "ATOM_FUSED_QK_NORM_ROPE": Variable(None, parse_bool, "default of AtomConfig.fused_qk_norm_rope (Qwen3's q/k "
                                                          "norm + rotary + KV write as one op); unset: on where the "
                                                          "host's attention layer supports it"),
    "ATOM_USE_PERSISTENT_MLA_DECODE_METADATA": Variable(True, parse_bool, "default of "
                                                        "AtomConfig.persistent_mla_decode_metadata"),
    "ATOM_OVERLAP_SCHEDULING": Variable(None, parse_bool, "default of EngineArgs.overlap_scheduling (native "
                                                          "engine); unset: on for a CUDA device, off on CPU"),
    # Frontends
    "ATOM_DISABLE_VLLM_PLUGIN": Variable(False, parse_bool, "1: atom-core's vLLM entry points do nothing (vLLM "
                                                            "runs its own models on its own platform)"),
    "ATOM_VLLM_COMPILE": Variable(True, parse_bool, "debug: 0 runs atom-core's decoder eagerly inside vLLM even "
                                                    "where vLLM compiles"),
    "ATOM_CACHE_DIR": Variable(Path.home() / ".cache" / "atom-core", lambda name, v: Path(v),
                               "where converted GGUF checkpoints (the default model among them) and "
                               "the demo checkpoint are kept"),
    # Defined by a host or library, read here too
    "TRITON_INTERPRET": Variable(False, parse_bool, "Triton's own: 1 runs Triton kernels in its CPU interpreter "
                                                    "(then no programmatic dependent launch)"),
    "OMP_NUM_THREADS": Variable(None, parse_positive_int, "OpenMP's own: torch's CPU threads; unset: the native "
                                                          "server's engine process takes cores - 1 on CPU"),
}


def _known(name: str) -> Variable:
    if name not in VARIABLES:
        raise AttributeError(f"atom_kernels.envs has no variable {name!r}; known: {', '.join(VARIABLES)}")
    return VARIABLES[name]


def __getattr__(name: str) -> Any:
    var = _known(name)
    raw = os.environ.get(name)
    return var.default if raw is None else var.parse(name, raw)


def __dir__() -> list[str]:
    return sorted([*globals(), *VARIABLES])
