"""cuda_graphs.no_gc, the guard around graph capture: garbage from before is collected on entry (a dead cycle's
destructors run then, not mid-capture), the collector stays off inside, and its state is restored after."""

from __future__ import annotations

import gc

from atom_frontends.native.cuda_graphs import no_gc


class _Dropped:
    freed = 0

    def __del__(self):
        _Dropped.freed += 1


def test_no_gc_collects_first_then_holds_the_collector_off():
    _Dropped.freed = 0
    cycle = [_Dropped()]
    cycle.append(cycle)
    del cycle
    assert gc.isenabled()
    with no_gc():
        assert _Dropped.freed == 1  # collected on entry
        assert not gc.isenabled()
        late = [_Dropped()]
        late.append(late)
        del late
        for _ in range(3):
            [object() for _ in range(10_000)]  # allocations that would trigger a collection
        assert _Dropped.freed == 1  # not collected inside
    assert gc.isenabled()
    gc.collect()
    assert _Dropped.freed == 2


def test_no_gc_keeps_a_disabled_collector_disabled():
    gc.disable()
    try:
        with no_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
