"""CUDA graphs of whole steps, one per graph shape (graph_shapes.py): decode steps over a ladder of batch sizes,
and steps that carry prefill tokens (prefills, chunks, prefills beside decodes) over a ladder of token counts.

A step is padded to the smallest captured shape that holds it (InputBuilder.build(batch, shape)) and replays the
graph captured for that shape: the runner's graph step (pending inputs resolved, the model forward, the logits of
the shape's R rows, the completing sequences' last tokens first, and their sample_tokens: argmax, or a draw at the
row's temperature), so a step whose rows ask nothing more launches nothing else. Eagerly, a prefill step of a small
model is bound by the CPU's launches (hundreds of kernels, ~20 ms of dispatch for 1.6 ms of GPU time on an H200);
as a graph it costs one launch.
The graph reads the InputBuilder's persistent device buffers (the layout of the shape, with each row's temperature
and Philox key), the runner's token buffers and the KV caches bound at capture time, so none may be reallocated
afterwards. Attention is captured with hints that are bounds (InputBuilder.graph_views), so its grids are
the same on every replay and cover every real step of the shape.
StepGraphs(capture=False) is the same contract without CUDA: every replay runs the step function eagerly on the
shape's padded inputs, which is how the padding is tested on a CPU.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator

import torch

from atom_core.forward_context import set_forward_context
from atom_frontends.native.graph_shapes import GraphShape, ShapeLadder
from atom_frontends.native.inputs import InputBuilder, StepInputs
from atom_kernels import dispatch

log = logging.getLogger(__name__)
Outputs = tuple[torch.Tensor, ...]


def why_not_capturable(device: torch.device, enforce_eager: bool, syncing_ops: tuple[str, ...]) -> str | None:
    """None when steps can run as CUDA graphs, else the reason they cannot. `syncing_ops`: the ops the
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


class StepGraphs:
    def __init__(self, step_fn: Callable[[StepInputs], Outputs], inputs: InputBuilder, ladder: ShapeLadder,
                 capture: bool = True) -> None:
        """step_fn(step) runs one padded step on the device (no CPU reads) and returns its output tensors; capture:
        CUDA graphs of it, else (a CPU) step_fn runs eagerly at every replay."""
        self.step_fn, self.inputs, self.ladder, self.capture = step_fn, inputs, ladder, capture
        # largest first: smaller graphs reuse its pool memory
        self.shapes = sorted(ladder.shapes, key=lambda s: (s.tokens, s.seqs), reverse=True)
        self.graphs: dict[GraphShape, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[GraphShape, Outputs] = {}  # shape → what step_fn returned while captured
        self.replays = 0
        if capture:
            self._capture_all()

    def _capture_all(self) -> None:
        start, free = time.perf_counter(), torch.cuda.mem_get_info()[0]
        pool = None
        with torch.inference_mode(), no_gc():
            for shape in self.shapes:
                self.graphs[shape], self.outputs[shape] = self._capture(shape, pool)
                pool = self.graphs[shape].pool()
        torch.cuda.synchronize()
        used = free - torch.cuda.mem_get_info()[0]
        log.info("captured CUDA graphs in %.1f s (%.0f MiB): decode batch sizes %s, token counts %s (prefill "
                 "and mixed steps)", time.perf_counter() - start, used / 2**20, self.ladder.decode_sizes,
                 self.ladder.token_sizes)

    def _capture(self, shape: GraphShape, pool) -> tuple[torch.cuda.CUDAGraph, Outputs]:
        step = self.inputs.build([], shape)  # all padding
        with set_forward_context(step.metadata):
            self.step_fn(step)  # warm-up: JIT/autotune outside capture
            torch.cuda.synchronize()
            # A new step (the same metadata object): per-step memos the warm-up made must not be captured as if
            # they were made by every replay.
            step = self.inputs.build([], shape)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                outputs = self.step_fn(step)
        return graph, outputs

    def pick(self, num_tokens: int, num_seqs: int) -> GraphShape | None:
        """The captured shape a step of num_tokens over num_seqs sequences pads to, None when there is none."""
        return self.ladder.pick(num_tokens, num_seqs)

    def replay(self, shape: GraphShape) -> Outputs:
        """Run the graph of `shape` on the inputs already in the buffers (InputBuilder.build(batch, shape));
        returns its step_fn's outputs."""
        self.replays += 1
        if not self.capture:
            step = self.inputs.graph_views(shape)
            with set_forward_context(step.metadata):
                return self.step_fn(step)
        self.graphs[shape].replay()
        return self.outputs[shape]
