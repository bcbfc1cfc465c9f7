"""Counts Triton JIT compilations: a timed region, or a step after the engine's kernel warm-up, should see none."""

from __future__ import annotations

import time


class JitWatch:
    """Counts Triton JIT compilations (in-process cache misses, disk-cache loads included) and their seconds
    inside a with-block: a timed region should report none."""

    def __init__(self) -> None:
        self.count, self.seconds, self._t0 = 0, 0.0, None
        self.kernels: list[str] = []  # the compiled kernels' names, in order
        try:
            import triton
            self.knobs = triton.knobs.runtime
        except (ImportError, AttributeError):  # triton missing or without knobs: nothing to watch
            self.knobs = None

    def _before(self, **kw):
        self._t0 = time.perf_counter()
        return None  # falsy: go on compiling

    def _after(self, **kw):
        self.count += 1
        self.kernels.append(getattr(kw.get("fn"), "name", "?"))
        if self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
        return None

    def __enter__(self):
        if self.knobs is not None:
            self._saved = (self.knobs.jit_cache_hook, self.knobs.jit_post_compile_hook)
            self.knobs.jit_cache_hook, self.knobs.jit_post_compile_hook = self._before, self._after
        return self

    def __exit__(self, *exc) -> None:
        if self.knobs is not None:
            self.knobs.jit_cache_hook, self.knobs.jit_post_compile_hook = self._saved

    def __str__(self) -> str:
        if self.knobs is None:
            return "not watched"
        return f"{self.count} ({self.seconds:.1f} s{': ' + ', '.join(self.kernels) if self.kernels else ''})"
