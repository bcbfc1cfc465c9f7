"""SGLang 0.5.23's decode CUDA-graph runner, as far as an attention backend sees it, on SGLang's own parts.

DecodeCudaGraphRunner (model_executor/runner/decode_cuda_graph_runner.py) makes its input buffers
(DecodeInputBuffers + build_decode_registry, padding policy included), calls init_cuda_graph_state and
get_cuda_graph_seq_len_fill_value; captures each size G largest first (capture_prepare's G-row DECODE ForwardBatch
on those buffers, init_forward_metadata_out_graph(fb, in_capture=True), then run_once three times:
FullCudaGraphBackend's two warm-ups and the capture, each starting with init_forward_metadata_in_graph); and per
replay runs fill_from (the real batch into the buffers, padding rows reset), build_replay_fb_view,
init_forward_metadata_out_graph(view), graph.replay(). This class makes the same calls in that order with SGLang's
own buffer classes and functions. The "graph" is a step on static inputs (one attention layer's forward on static
q/k/v buffers, or a whole model's forward on the runner's input_ids/positions): a real torch.cuda.CUDAGraph on CUDA;
on CPU, where nothing can be captured, the same step re-run on the same static buffers with the metadata captured
for G (what a replay would read).
Needs SGLang's runtime context (batches.sglang_runtime).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class Graph:
    fb: object  # the capture ForwardBatch (views of the runner's buffers)
    md: object  # the backend's forward_metadata at capture
    inputs: Sequence[torch.Tensor]  # the step's static inputs besides fb's, [G, ...]
    out: torch.Tensor | None = None  # the captured step's output
    cuda_graph: object = None
    pointers: dict | None = None  # data_ptr of every tensor the kernels read, at capture


def metadata_pointers(md) -> dict[str, int]:
    """The addresses a captured graph baked in: every tensor of the metadata (MLA decode pages included)."""
    names = ("slot_mapping", "block_tables", "seq_lens", "query_start_loc", "positions")
    ptrs = {n: getattr(md, n).data_ptr() for n in names}
    if md.mla_decode is not None:
        ptrs |= {f"mla_decode.{n}": t.data_ptr() for n, t in md.mla_decode._asdict().items()}
    return ptrs


class DecodeGraphRunner:
    def __init__(self, backend, sizes: list[int], step: Callable[..., torch.Tensor],
                 static_inputs: Callable[[int], Sequence[torch.Tensor]] = lambda size: (),
                 caches: Sequence[torch.Tensor] = ()) -> None:
        """step(fb, *static_inputs(G)) → output [G, ...]: what a graph of size G captures, run inside SGLang's
        forward context for fb; replay(fb, *values) writes values into the static inputs' first rows. caches: the KV
        cache views the step reads (their addresses are checked too)."""
        from sglang.srt.model_executor.cuda_graph_buffer_registry import build_decode_registry
        from sglang.srt.model_executor.runner_utils.buffers import DecodeInputBuffers

        self.backend, self.sizes, self.step, self.static_inputs = backend, sorted(sizes), step, static_inputs
        self.caches = caches
        self.device = torch.device(backend.device)
        max_bs = self.sizes[-1]
        backend.init_cuda_graph_state(max_bs, max_bs)
        self.fill = backend.get_cuda_graph_seq_len_fill_value()
        self.buffers = DecodeInputBuffers.create(
            device=self.device, max_bs=max_bs, max_num_token=max_bs, hidden_size=8,
            next_token_logits_buffer=torch.zeros(max_bs, 8, device=self.device), dtype=torch.float32,
            num_dp_ranks=1, pp_size=1, is_encoder_decoder=False, require_mlp_tp_gather=False,
            seq_len_fill_value=self.fill, encoder_len_fill_value=0, num_tokens_per_req=1,
            cache_loc_dtype=torch.int64, enable_mamba_track=False)
        self.registry = build_decode_registry(device=self.device, max_bs=max_bs, max_num_token=max_bs,
                                              seq_len_fill_value=self.fill, cache_loc_dtype=torch.int64,
                                              share_pool=False, source=self.buffers)
        self.graphs: dict[int, Graph] = {}

    def capture(self) -> None:
        self.buffers.seq_lens.fill_(self.fill)
        self.buffers.seq_lens_cpu.fill_(self.fill)
        self.buffers.reset_index_buffers()
        for size in reversed(self.sizes):
            self.graphs[size] = self._capture_one(size)

    def _capture_one(self, size: int) -> Graph:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

        slot = {n: self.registry.get_slot(n).slice_for(size, size)
                for n in ("input_ids", "req_pool_indices", "seq_lens", "seq_lens_cpu", "out_cache_loc", "positions")}
        fb = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=size, orig_seq_lens=slot["seq_lens"],
                          seq_lens_sum=int(slot["seq_lens"].sum()), capture_hidden_mode=CaptureHiddenMode.NULL,
                          **slot)
        self.backend.init_forward_metadata_out_graph(fb, in_capture=True)
        graph = Graph(fb, self.backend.forward_metadata, self.static_inputs(size))
        graph.pointers = self._pointers(graph)
        for _ in range(2):  # FullCudaGraphBackend.capture_one's two warm-up runs
            self._run_once(graph)
        if self.device.type == "cuda":
            graph.cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph.cuda_graph):
                graph.out = self._run_once(graph)
        else:
            graph.out = self._run_once(graph)
        return graph

    def _pointers(self, graph: Graph) -> dict[str, int]:
        """What the captured kernels read: the metadata's tensors and the KV cache views."""
        return metadata_pointers(graph.md) | {f"cache{i}": c.data_ptr() for i, c in enumerate(self.caches)}

    def _run(self, graph: Graph) -> torch.Tensor:
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        with forward_context(ForwardContext(attn_backend=self.backend), forward_batch=graph.fb):
            return self.step(graph.fb, *graph.inputs)

    def _run_once(self, graph: Graph) -> torch.Tensor:
        self.backend.init_forward_metadata_in_graph(graph.fb)
        return self._run(graph)

    def replay(self, fb, *values: torch.Tensor) -> torch.Tensor:
        """One decode step of the real batch fb through the graph of the smallest captured size >= its batch size:
        the real rows' outputs [raw_bs, ...]. Static inputs' padding rows get random values (what stale buffers
        hold); those not given values (a view of another, as SGLang's MLA v of k) are left alone."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import build_replay_fb_view

        raw = fb.batch_size
        size = self.sizes[bisect.bisect_left(self.sizes, raw)]
        graph = self.graphs[size]
        self.registry.fill_from(fb, raw_bs=raw, padded_bs=size, raw_num_tokens=raw, padded_num_tokens=size)
        view = build_replay_fb_view(fb, self.buffers, bs=size, raw_bs=raw, num_tokens=size,
                                    global_num_tokens_cpu=None, seq_len_fill_value=self.fill,
                                    capture_forward_mode=ForwardMode.DECODE, is_encoder_decoder=False)
        self.backend.init_forward_metadata_out_graph(view)
        for static, new in zip(graph.inputs, values):
            static.normal_()
            static[:raw].copy_(new)
        if graph.cuda_graph is not None:
            graph.cuda_graph.replay()
            out = graph.out
        else:
            # what the captured graph reads: the metadata object and tensors of its capture
            assert self.backend.forward_metadata is graph.md
            out = self._run(graph)
        assert self._pointers(graph) == graph.pointers, "a replay must read the capture's addresses"
        return out[:raw].clone()
