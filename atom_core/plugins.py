"""Plugin manager and host detection.

Frontends are pluggy plugins: the built-in ones are listed here (BUILTIN_FRONTENDS, so a source checkout that was
not pip-installed has them), third-party ones come through the entry-point group `atom.frontends`. Environment
(atom_kernels.envs): ATOM_HOST forces the host, ATOM_FRONTENDS / ATOM_DISABLE_FRONTENDS pick the frontends loaded,
ATOM_TRACE_HOOKS=1 logs every hook call.

The core calls every hook (hookspecs.py), at the place that needs the answer: current_host (atom_detect_host),
current_platform (atom_platform), loader.build_model (atom_translate_config), the Attention factory
(atom_attention_impl, atom_metadata_builder). A frontend never calls a hook.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from importlib.metadata import entry_points
from typing import Any

import pluggy

from atom_core import hookspecs
from atom_kernels import envs

logger = logging.getLogger("atom_core.plugins")
ENTRY_POINT_GROUP = "atom.frontends"
# Frontend name (= its host name) → the module implementing its hooks.
BUILTIN_FRONTENDS = {
    "native": "atom_frontends.native.hooks",
    "vllm": "atom_frontends.vllm.hooks",
    "sglang": "atom_frontends.sglang.hooks",
}

_lock = threading.Lock()
_manager: pluggy.PluginManager | None = None


def _load_frontends(pm: pluggy.PluginManager) -> None:
    """The built-in frontends, then the entry points' (a name already registered is skipped)."""
    allow, deny = envs.ATOM_FRONTENDS, envs.ATOM_DISABLE_FRONTENDS or frozenset()
    found = [(name, functools.partial(importlib.import_module, module)) for name, module in BUILTIN_FRONTENDS.items()]
    found += [(ep.name, ep.load) for ep in entry_points(group=ENTRY_POINT_GROUP)]
    for name, load in found:
        if (allow is not None and name not in allow) or name in deny or pm.get_plugin(name) is not None:
            continue
        pm.register(load(), name=name)


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager, with every allowed frontend of `atom.frontends` registered."""
    global _manager
    with _lock:
        if _manager is None:
            pm = pluggy.PluginManager(hookspecs.PROJECT)
            pm.add_hookspecs(hookspecs.AtomHookSpecs)
            _load_frontends(pm)
            if envs.ATOM_TRACE_HOOKS:
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
    forced = envs.ATOM_HOST
    if forced:
        if forced not in loaded:
            raise RuntimeError(
                f"ATOM_HOST={forced!r} but no loaded frontend has that name (loaded: {loaded or 'none'}); "
                "install the frontend that defines it or fix ATOM_FRONTENDS/ATOM_DISABLE_FRONTENDS"
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


class HostHooks:
    """The hooks of one host's frontend alone (a frontend's name is its host's name): `host_hooks(h).atom_platform()`
    asks only frontend `h`, so a frontend answers for its own host without checking which host was meant."""

    def __init__(self, pm: pluggy.PluginManager, host: str) -> None:
        if pm.get_plugin(host) is None:
            raise RuntimeError(f"no frontend named {host!r} is loaded (frontends loaded: {frontend_names()})")
        self._pm, self.host = pm, host
        self._others = [plugin for name, plugin in pm.list_name_plugin() if name != host]

    def __getattr__(self, hook_name: str) -> Any:
        caller = self._pm.subset_hook_caller(hook_name, remove_plugins=self._others)

        def ask(**kwargs: Any) -> Any:
            result = caller(**kwargs)
            if result is None:
                raise RuntimeError(f"frontend {self.host!r} gave no answer to {hook_name} "
                                   f"(frontends loaded: {frontend_names()})")
            return result

        return ask


def host_hooks(host: str | None = None) -> HostHooks:
    """The hooks of `host`'s frontend (default: the current host's)."""
    return HostHooks(get_plugin_manager(), host or current_host())


def current_platform(host: str | None = None):
    """The Platform of `host` (default: the current one), from its frontend's atom_platform."""
    return host_hooks(host).atom_platform()
