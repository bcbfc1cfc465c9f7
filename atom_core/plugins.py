"""Plugin manager and host detection.

Frontends (built-in ones included) are pluggy plugins found through the entry-point group
`atom.frontends`. Environment:
  ATOM_HOST=native|vllm|sglang   force the host instead of asking atom_detect_host
  ATOM_FRONTENDS=a,b             load only these frontends
  ATOM_DISABLE_FRONTENDS=a,b     never load these
  ATOM_TRACE_HOOKS=1             log every hook call and its result
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from importlib.metadata import entry_points
from typing import Any

import pluggy

from atom_core import hookspecs

logger = logging.getLogger("atom_core.plugins")
ENTRY_POINT_GROUP = "atom.frontends"

_lock = threading.Lock()
_manager: pluggy.PluginManager | None = None


def _names(var: str) -> set[str] | None:
    value = os.environ.get(var, "").strip()
    return {n.strip() for n in value.split(",") if n.strip()} if value else None


def _load_frontends(pm: pluggy.PluginManager) -> None:
    allow, deny = _names("ATOM_FRONTENDS"), _names("ATOM_DISABLE_FRONTENDS") or set()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if (allow is not None and ep.name not in allow) or ep.name in deny:
            continue
        if pm.get_plugin(ep.name) is not None:
            continue
        pm.register(ep.load(), name=ep.name)


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager, with every allowed frontend of `atom.frontends` registered."""
    global _manager
    with _lock:
        if _manager is None:
            pm = pluggy.PluginManager(hookspecs.PROJECT)
            pm.add_hookspecs(hookspecs.AtomHookSpecs)
            _load_frontends(pm)
            if os.environ.get("ATOM_TRACE_HOOKS") == "1":
                pm.trace.root.setwriter(lambda msg: logger.info("hook: %s", " ".join(msg.split())))
                pm.enable_tracing()
            _manager = pm
        return _manager


def reset_plugin_manager() -> None:
    """Forget the manager so the next call re-reads the environment (tests, re-configuration)."""
    global _manager
    with _lock:
        _manager = None


def frontend_names() -> list[str]:
    return [name for name, _ in get_plugin_manager().list_name_plugin()]


def hook() -> Any:
    return get_plugin_manager().hook


# The host of the innermost HostMarker.scope() entered in this context: an explicit scope beats
# process-wide claims, so e.g. a native LLM can run inside a process SGLang has claimed.
_innermost_scope: ContextVar[str | None] = ContextVar("atom_innermost_host_scope", default=None)


class HostMarker:
    """How a frontend says "my host drives this process / this scope".

    `activate_process()` is for hosts that own the whole process (vLLM/SGLang call our entry
    points in every process). `scope()` marks a block, through a ContextVar, so a target and a
    draft model (or a test) can run under different hosts in one process.
    """

    def __init__(self, host: str) -> None:
        self.host = host
        self._scoped: ContextVar[bool | None] = ContextVar(f"atom_host_{host}", default=None)
        self._process = False

    def activate_process(self) -> None:
        self._process = True

    def deactivate_process(self) -> None:
        self._process = False

    @contextlib.contextmanager
    def scope(self, active: bool = True) -> Iterator[None]:
        token = self._scoped.set(active)
        inner = _innermost_scope.set(self.host if active else None)
        try:
            yield
        finally:
            _innermost_scope.reset(inner)
            self._scoped.reset(token)

    def is_active(self) -> bool:
        scoped = self._scoped.get()
        return self._process if scoped is None else scoped

    def detect(self) -> str | None:
        return self.host if self.is_active() else None


def current_host() -> str:
    """The host driving this process/scope: ATOM_HOST, else the innermost explicit host scope,
    else the one frontend that claims it (atom_detect_host)."""
    loaded = frontend_names()
    forced = os.environ.get("ATOM_HOST")
    if forced:
        if forced not in loaded:
            raise RuntimeError(
                f"ATOM_HOST={forced!r} but no loaded frontend has that name (loaded: {loaded or 'none'}); "
                "install atom-core (pip install -e .) or fix ATOM_FRONTENDS/ATOM_DISABLE_FRONTENDS"
            )
        return forced
    scoped = _innermost_scope.get()
    if scoped is not None and scoped in loaded:
        return scoped
    answers = [a for a in hook().atom_detect_host() if a]
    if len(answers) == 1:
        return answers[0]
    if not answers:
        raise RuntimeError(
            f"no atom-core frontend claims this process (frontends loaded: {loaded or 'none'}). "
            "Run inside a host (native LLM, vLLM, SGLang), enter a host scope "
            "(e.g. atom_frontends.native.hooks.NATIVE.scope()) or set ATOM_HOST=native"
        )
    raise RuntimeError(
        f"several frontends claim this process: {sorted(answers)} (loaded: {loaded}); "
        "set ATOM_HOST to pick one or ATOM_DISABLE_FRONTENDS to drop the others"
    )


def _one(result: Any, what: str, host: str) -> Any:
    if result is None:
        raise RuntimeError(
            f"no frontend answered {what} for host {host!r} (frontends loaded: {frontend_names()})"
        )
    return result


def current_platform(host: str | None = None):
    host = host or current_host()
    return _one(hook().atom_platform(host=host), "atom_platform", host)


def translate_config(host_config: Any, host: str | None = None):
    host = host or current_host()
    return _one(hook().atom_translate_config(host=host, host_config=host_config), "atom_translate_config", host)


def metadata_builder(spec: Any, host: str | None = None):
    host = host or current_host()
    return _one(hook().atom_metadata_builder(host=host, spec=spec), "atom_metadata_builder", host)


def attention_impl(spec: Any, host: str | None = None) -> type:
    host = host or current_host()
    return _one(hook().atom_attention_impl(host=host, spec=spec), "atom_attention_impl", host)
