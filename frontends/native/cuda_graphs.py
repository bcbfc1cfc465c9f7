"""CUDA graphs of whole decode-only steps, over a ladder of batch sizes.

A step whose sequences all add exactly one token is padded to the next captured size G and
replays the graph captured for G: the runner's decode step (pending inputs resolved, the model
forward, the logits of all G rows and their sample_tokens: argmax, or a draw at the row's temperature), so
a step whose rows ask nothing more launches nothing else.
The graph reads the InputBuilder's persistent device buffers (the layout of a G-row decode step, with
each row's temperature and Philox key),
the runner's token buffers and the KV caches bound at capture time, so none may be reallocated
afterwards. Attention is captured with static hints (max_query_len 1, max_seq_len
max_model_len) so its grid is the same on every replay.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import logging
from collections.abc import Callable, Iterator

import torch

from atom_core.forward_context import set_forward_context
from atom_frontends.native.inputs import InputBuilder, StepInputs
from atom_kernels import dispatch

log = logging.getLogger(__name__)
Outputs = tuple[torch.Tensor, ...]


def batch_size_ladder(max_size: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, ... (steps of 8), max_size."""
    sizes = {b for b in (1, 2, 4, 8) if b < max_size} | set(range(16, max_size, 8)) | {max_size}
    return sorted(sizes)


def why_not_capturable(device: torch.device, enforce_eager: bool, syncing_ops: tuple[str, ...]) -> str | None:
    """None when decode steps can run as CUDA graphs, else the reason they cannot. `syncing_ops`: the ops the
    model's attention layers run whose torch reference syncs with the CPU (.tolist(), boolean-mask indexing)."""
    if device.type != "cuda":
        return f"device is {device.type}"
    if enforce_eager:
        return "enforce_eager=True"
    torch_ops = [op for op in syncing_ops if dispatch.backend_for(op, "cuda") == "torch"]
    if torch_ops:
        return f"{', '.join(torch_ops)} would run the torch reference, which syncs with the CPU"
    return None


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Collect garbage now, then no collection until the block ends. Capture runs in CUDA's global mode, where
    freeing device or pinned memory, or destroying an event or a graph, invalidates the capture; a dead reference
    cycle holding such objects (an engine dropped before this one was built) would do that if the collector ran
    mid-capture (torch.cuda.graph no longer collects first): an fp32 engine built right after others then fails
    its capture at random (cuBLAS "execution failed", then "operation failed due to a previous error during
    capture"). vLLM freezes the collector while it captures for the same reason."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class DecodeGraphs:
    def __init__(self, step_fn: Callable[[StepInputs], Outputs], inputs: InputBuilder, sizes: list[int]) -> None:
        """step_fn(step) runs one decode step on the device (no CPU reads) and returns its output tensors."""
        self.sizes = sorted(sizes)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Outputs] = {}  # size → what step_fn returned while captured
        pool = None
        with torch.inference_mode(), no_gc():
            for size in reversed(self.sizes):  # largest first: smaller graphs reuse its pool memory
                step = inputs.build([], graph_size=size)  # all rows padding
                with set_forward_context(step.metadata):
                    step_fn(step)  # warm-up: JIT/autotune outside capture
                    torch.cuda.synchronize()
                    # A new step (the same metadata object): per-step memos the warm-up made must not be
                    # captured as if they were made by every replay.
                    step = inputs.build([], graph_size=size)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        self.outputs[size] = step_fn(step)
                pool = graph.pool()
                self.graphs[size] = graph
        torch.cuda.synchronize()
        log.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def padded_size(self, num_seqs: int) -> int | None:
        """The smallest captured size >= num_seqs, None when there is none."""
        i = bisect.bisect_left(self.sizes, num_seqs)
        return self.sizes[i] if i < len(self.sizes) else None

    def replay(self, size: int) -> Outputs:
        """Run the graph for `size` on the inputs already in the buffers; returns its step_fn's outputs."""
        self.graphs[size].replay()
        return self.outputs[size]
