"""Runtime bridge: SGLang's ForwardBatch → the core's forward context, for one model forward.

`forward_batch_context(fb)` enters the SGLang host scope and publishes, through
`atom_core.forward_context.set_forward_context`, the batch and (when the active attention backend
is atom-core's) the AttentionMetadata built for it. Both are ContextVars restored on exit, so a
target model and a draft model running in one process, even nested, never see each other's batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from atom_core.forward_context import (
    AttentionMetadata,
    ForwardContext,
    get_forward_context,
    set_forward_context,
)
from atom_frontends.sglang.hooks import SGLANG

FORWARD_BATCH = "sglang_forward_batch"


def _active_metadata() -> AttentionMetadata | None:
    """The metadata atom-core's backend built for this batch; None under another backend."""
    from sglang.srt.model_executor.forward_context import get_attn_backend, has_forward_context

    if not has_forward_context():
        return None
    md = getattr(get_attn_backend(), "forward_metadata", None)
    return md if isinstance(md, AttentionMetadata) else None


@contextlib.contextmanager
def forward_batch_context(forward_batch: Any, attn_metadata: AttentionMetadata | None = None
                          ) -> Iterator[ForwardContext]:
    """Make `forward_batch` (sglang ForwardBatch) the current batch of the core for one forward."""
    md = attn_metadata if attn_metadata is not None else _active_metadata()
    with SGLANG.scope(), set_forward_context(md, **{FORWARD_BATCH: forward_batch}) as ctx:
        yield ctx


def current_forward_batch() -> Any:
    """The ForwardBatch of the innermost forward_batch_context."""
    try:
        batch = get_forward_context().extra.get(FORWARD_BATCH)
    except RuntimeError:
        batch = None
    if batch is None:
        raise RuntimeError(
            "an atom-core attention layer ran outside an SGLang forward: call the model through its "
            "SGLang wrapper (atom_frontends.sglang.models), which enters "
            "atom_frontends.sglang.bridge.forward_batch_context(forward_batch)"
        )
    return batch
