"""atom-core's SGLang attention backend in SGLang's decode CUDA graphs: capture once, replay many decode steps.

decode_graphs.DecodeGraphRunner makes the calls SGLang's DecodeCudaGraphRunner makes, in its order, with SGLang's own
input buffers, padding policy and replay view. Each replayed step (fewer rows than captured, padding rows, growing
lengths) must equal SGLang's torch_native backend (the oracle) and our eager path on the real rows, outputs and KV
pools alike (so padding rows wrote nowhere), while every tensor the kernels read keeps its capture address. A canary
leaves one buffer stale at replay and must fail. On CPU the graph's forward re-runs eagerly on the captured metadata
(the torch reference reads the refilled buffers); the same steps run the Triton kernels under Triton's interpreter
(reading the buffers through pointers, as a graph does) and, marked gpu, a real torch.cuda.CUDAGraph.
"""

from __future__ import annotations

import pytest
import torch

from tests.frontends.sglang.batches import Requests, make_runner, sglang_runtime
from tests.frontends.sglang.decode_graphs import DecodeGraphRunner
from tests.interpreter import run_under_interpreter

HEADS, KV_HEADS, HEAD_DIM, RANK, ROPE = 4, 2, 16, 16, 8
LENGTHS = [7, 30, 1, 12, 20]
SIZES = [2, 4]  # captured batch sizes
# decode steps: request → (position, position + 1); 3 rows → graph 4, 4 → 4, 1 → 2, 2 → 2, 5 → eager
STEPS = [{1: (4, 5), 2: (20, 21), 5: (9, 10)},
         {1: (5, 6), 2: (21, 22), 3: (0, 1), 4: (11, 12)},
         {2: (29, 30)},
         {5: (19, 20), 1: (6, 7)},
         {1: (6, 7), 2: (12, 13), 3: (0, 1), 4: (3, 4), 5: (10, 11)}]


def _pool_buffers(runner) -> list[torch.Tensor]:
    pool = runner.token_to_kv_pool
    return list(pool.kv_buffer) if hasattr(pool, "kv_buffer") else [*pool.k_buffer, *pool.v_buffer]


def _layer(mla: bool, window: int | None):
    from atom_core.layers.attention import AttentionSpec
    from atom_frontends.sglang.attention import SGLangAttention, SGLangMLAAttention

    if mla:
        return SGLangMLAAttention(AttentionSpec(HEADS, RANK + ROPE, 0.3, 1, "model.layers.1.self_attn.attn",
                                                kv_lora_rank=RANK, qk_rope_head_dim=ROPE))
    return SGLangAttention(AttentionSpec(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS, "model.layers.1.self_attn.attn",
                                         sliding_window=window))


def decode_steps(mla: bool = False, window: int | None = None, device: str = "cpu") -> list[dict]:
    """Capture SIZES, then run STEPS through the graphs (the last, 5 rows, eagerly as SGLang would), our eager path
    and torch_native, from identical pools. Per step: the three outputs, whether the pools agree, the padding slots."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from atom_frontends.sglang.backend import create_backend

    pool = dict(kv_heads=1, head_dim=RANK + ROPE, mla_rope_dim=ROPE) if mla else dict(kv_heads=KV_HEADS,
                                                                                       head_dim=HEAD_DIM)
    runners = [make_runner(2, device=device, **pool) for _ in range(3)]  # graph, eager, oracle
    torch.manual_seed(0)
    for buf in _pool_buffers(runners[0]):
        buf.normal_()
    reqs = [Requests(r) for r in runners]
    for n in LENGTHS:
        tokens = torch.randint(3, 300, (n,)).tolist()
        for r in reqs:
            r.add(tokens)
    layer = _layer(mla, window)
    graph_backend = create_backend(runners[0])
    q_shape, k_shape = ((HEADS, RANK + ROPE), (1, RANK + ROPE)) if mla else ((HEADS * HEAD_DIM,), (KV_HEADS, HEAD_DIM))

    def static_inputs(size: int) -> tuple[torch.Tensor, ...]:
        q, k = torch.zeros(size, *q_shape, device=device), torch.zeros(size, *k_shape, device=device)
        return (q, k, k[..., :RANK]) if mla else (q, k, torch.zeros_like(k))  # SGLang's MLA v: a view of k

    def step(fb, q, k, v):
        return graph_backend.forward(q, k, v, layer, fb)

    graphs = DecodeGraphRunner(graph_backend, SIZES, step, static_inputs, graph_backend._caches(layer))
    graphs.capture()  # its runs write SGLang's padding slot 0: copy the pool afterwards
    for other in runners[1:]:
        for a, b in zip(_pool_buffers(runners[0]), _pool_buffers(other)):
            b.copy_(a)
    eager, oracle = create_backend(runners[1]), TorchNativeAttnBackend(runners[2])
    results = []
    for step in STEPS:
        fbs = [r.batch(step) for r in reqs]
        t = fbs[0].batch_size
        q, k = torch.randn(t, *q_shape, device=device), torch.randn(t, *k_shape, device=device)
        v = k[..., :RANK] if mla else torch.randn(t, *k_shape, device=device)
        if t <= SIZES[-1]:
            got = graphs.replay(fbs[0], q, k) if mla else graphs.replay(fbs[0], q, k, v)
            padding = graph_backend.forward_metadata.slot_mapping[t:].tolist()
        else:  # larger than any graph: SGLang runs it eagerly, on the same backend
            graph_backend.init_forward_metadata(fbs[0])
            got, padding = graph_backend.forward(q, k, v, layer, fbs[0]), []
        outs = [got]
        for backend, fb in ((eager, fbs[1]), (oracle, fbs[2])):
            backend.init_forward_metadata(fb)
            outs.append(backend.forward(q.clone(), k.clone(), v.clone(), layer, fb))
        pools = [_pool_buffers(r) for r in runners]
        results.append(dict(graph=outs[0], eager=outs[1], oracle=outs[2], padding=padding,
                            pools_agree=all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(*pools))))
    return results


def assert_steps_match(results: list[dict], tol: float = 1e-5) -> None:
    for i, r in enumerate(results):
        torch.testing.assert_close(r["graph"], r["oracle"], atol=tol, rtol=tol, msg=f"step {i}: graph vs oracle")
        torch.testing.assert_close(r["graph"], r["eager"], atol=tol, rtol=tol, msg=f"step {i}: graph vs eager")
        assert r["pools_agree"], f"step {i}: KV pools differ (a padding row wrote somewhere, or a real row did not)"
        assert all(s == -1 for s in r["padding"]), f"step {i}: padding rows' slots {r['padding']}"


@pytest.fixture
def runtime(sglang_checkpoint):
    with sglang_runtime(sglang_checkpoint("llama")):  # SGLang's buffers and MLA pool read its published config
        yield


@pytest.mark.parametrize("window", [None, 5])
def test_decode_graph_replays_match_torch_native(runtime, window):
    assert_steps_match(decode_steps(window=window))


def test_mla_decode_graph_replays_match_torch_native(runtime):
    assert_steps_match(decode_steps(mla=True))


def _stale_at_replay(monkeypatch, what: str) -> None:
    """Canary: replays keep `what` (a buffer of DecodeGraphBuffers, or the per-step memo) as it was."""
    from atom_frontends.sglang import graphs

    refill = graphs.DecodeGraphBuffers.refill

    def stale_refill(self, fb):
        if what == "plan_cache":
            kept = dict(self.metadata(fb.batch_size).plan_cache)
            md = refill(self, fb)
            md.plan_cache.update(kept)
            return md
        buf = self.mla.kv_indices if what == "mla.kv_indices" else getattr(self, what)
        before = buf.clone()
        md = refill(self, fb)
        buf.copy_(before)
        return md

    monkeypatch.setattr(graphs.DecodeGraphBuffers, "refill", stale_refill)


@pytest.mark.parametrize("what", ["block_tables", "seq_lens", "slot_mapping", "plan_cache"])
def test_canary_a_stale_buffer_fails(runtime, monkeypatch, what):
    _stale_at_replay(monkeypatch, what)  # (the MLA pages' canary runs under the interpreter: Triton reads them)
    with pytest.raises(AssertionError, match="step"):  # a comparison fails, not the protocol's own checks
        assert_steps_match(decode_steps())


def test_other_graphs_are_refused_with_advice(runtime):
    from atom_frontends.sglang.backend import create_backend

    runner = make_runner(2, KV_HEADS, HEAD_DIM)
    reqs = Requests(runner)
    reqs.add(list(range(3, 12)))
    backend = create_backend(runner)
    with pytest.raises(NotImplementedError, match="speculative"):
        backend.init_cuda_graph_state(4, 8)  # several tokens per request: verify/draft graphs
    backend.init_cuda_graph_state(4, 4)
    with pytest.raises(NotImplementedError, match="--cuda-graph-backend-prefill=breakable"):
        backend.init_forward_metadata_out_graph(reqs.batch({1: (0, 9)}), in_capture=True)  # full prefill graphs
    with pytest.raises(RuntimeError, match="--enable-torch-compile"):
        backend.init_cpu_graph_state(8, 8)
    # the padding rows' seq_len also fills DP-attention batches on SGLang's CPU engine, graphs or not
    assert backend.get_cpu_graph_seq_len_fill_value() == backend.get_cuda_graph_seq_len_fill_value()


TRITON_KERNELS = {"write_kv_cache": "atom_kernels.triton.kv_cache:write_kv_cache",
                  "paged_attention": "atom_kernels.triton.attention:paged_attention",
                  "write_latent_cache": "atom_kernels.triton.mla.cache:write_latent_cache",
                  "mla_attention": "atom_kernels.triton.mla:mla_attention",
                  "mla_kv_indices": "atom_kernels.triton.mla.kv_indices:mla_kv_indices"}


def run_under_triton(path: str) -> None:
    """In the interpreter subprocess: the steps with atom_kernels' Triton kernels as the dispatcher's "provided" CPU
    backend (our graph and eager paths alike; torch_native, the oracle, is SGLang's own): they read the metadata
    through pointers at run time, as a replayed graph's kernels do, with the capture's static hints."""
    from atom_kernels import dispatch

    for op, target in TRITON_KERNELS.items():
        dispatch.register(op, "provided", target, device_type="cpu")
    assert all(dispatch.backend_for(op, "cpu") == "provided" for op in TRITON_KERNELS)
    with sglang_runtime(path):
        assert_steps_match(decode_steps())
        assert_steps_match(decode_steps(mla=True))
        # canary: the MLA decode kernel reads its pages from the refilled kv_indices (the torch reference does not)
        with pytest.MonkeyPatch.context() as monkeypatch:
            _stale_at_replay(monkeypatch, "mla.kv_indices")
            with pytest.raises(AssertionError, match="step"):
                assert_steps_match(decode_steps(mla=True))
    print("graph steps on triton passed")


@pytest.mark.slow
def test_decode_graph_replays_on_triton_kernels_under_the_interpreter(sglang_checkpoint):
    path = str(sglang_checkpoint("llama"))
    code = f"from tests.frontends.sglang.test_graphs import run_under_triton; run_under_triton({path!r})"
    run_under_interpreter(code, "graph steps on triton passed")


@pytest.mark.gpu
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_decode_graph_replays_on_a_cuda_graph(runtime, mla):
    assert_steps_match(decode_steps(mla=mla, device="cuda"), tol=1e-4)
