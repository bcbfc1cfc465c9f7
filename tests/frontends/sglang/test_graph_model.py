"""Whole atom-core models (our SGLang EntryClasses: Qwen3; DeepSeek-V3 on SGLang's MLA pool) decoding through
SGLang's decode-graph protocol: requests prefilled eagerly, then decode steps replayed through graphs captured once
(decode_graphs.DecodeGraphRunner: SGLang's own input buffers, padding, replay view), every layer reading the one
captured metadata through the runtime bridge. Each real row's logits == transformers' on the same checkpoint (the
outside oracle), for batches with fewer rows than the graph (padding rows) and growing lengths; then a decode batch
runs eagerly on the same backend."""

from __future__ import annotations

import pytest
import torch

from tests.frontends.sglang.batches import Requests, load_sglang_model, make_runner, sglang_runtime
from tests.frontends.sglang.decode_graphs import DecodeGraphRunner

PROMPTS = [[5, 17, 99, 3, 250, 41], [7, 200, 31, 64, 9, 12, 88, 101, 44], [60, 61, 62, 63, 64, 65],
           [9, 8, 7, 6, 5, 4, 3, 2]]
DECODED = 4  # the last DECODED tokens of each prompt are fed one step at a time (teacher forcing)
STEPS = [[1, 2, 3], [1, 2, 3, 4], [2], [1, 4], [1, 2, 3, 4]]  # request ids per step: graphs of 4, 4, 2, 2, 4


def _hf_last_logits(path, prefixes: list[list[int]]) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True).eval()
    with torch.inference_mode():
        return [model(torch.tensor([p])).logits[0, -1] for p in prefixes]


def decode_through_graphs(path, device: str = "cpu") -> tuple[list[torch.Tensor], list[list[int]]]:
    """Each decoded row's logits (on the CPU) and the prefix they predict from."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from atom_frontends.sglang.backend import create_backend

    model = load_sglang_model(path).to(device)
    cfg = model.config
    if getattr(cfg, "kv_lora_rank", None):  # DeepSeek: SGLang's MLA pool, rows of kv_lora_rank + qk_rope_head_dim
        pool = dict(kv_heads=1, head_dim=cfg.kv_lora_rank + cfg.qk_rope_head_dim, mla_rope_dim=cfg.qk_rope_head_dim)
    else:
        pool = dict(kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim)
    runner = make_runner(cfg.num_hidden_layers, device=device, **pool)
    backend = create_backend(runner)
    reqs = Requests(runner)
    rids = [reqs.add(p) for p in PROMPTS]

    def step(fb):
        return model(fb.input_ids, fb.positions, fb).next_token_logits

    graphs = DecodeGraphRunner(backend, [2, 4], step)
    graphs.capture()
    prefill = reqs.batch({r: (0, len(p) - DECODED) for r, p in zip(rids, PROMPTS)})
    backend.init_forward_metadata(prefill)
    with forward_context(ForwardContext(attn_backend=backend), forward_batch=prefill):
        step(prefill)
    done = {r: len(p) - DECODED for r, p in zip(rids, PROMPTS)}  # tokens in the KV cache
    got, prefixes = [], []
    for i, step_rids in enumerate(STEPS):
        fb = reqs.batch({r: (done[r], done[r] + 1) for r in step_rids})
        if i < len(STEPS) - 1:
            got += list(graphs.replay(fb).cpu())
        else:  # as SGLang runs a decode batch no graph serves: eagerly, on the same backend
            backend.init_forward_metadata(fb)
            with forward_context(ForwardContext(attn_backend=backend), forward_batch=fb):
                got += list(step(fb).cpu())
        for r in step_rids:
            done[r] += 1
            prefixes.append(PROMPTS[r - 1][: done[r]])
    return got, prefixes


def assert_match_transformers(path, got: list[torch.Tensor], prefixes: list[list[int]], tol: float) -> None:
    for i, (ours, want) in enumerate(zip(got, _hf_last_logits(path, prefixes), strict=True)):
        torch.testing.assert_close(ours, want, atol=tol, rtol=tol, msg=f"row {i} ({prefixes[i]})")


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "DeepseekV3ForCausalLM"])
def test_model_decode_steps_through_graphs_match_transformers(checkpoint_factory, arch):
    path = checkpoint_factory(arch)
    with sglang_runtime(path):
        got, prefixes = decode_through_graphs(path)
    assert_match_transformers(path, got, prefixes, 2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "DeepseekV3ForCausalLM"])
def test_model_decode_steps_on_cuda_graphs_match_transformers(checkpoint_factory, arch):
    """The same steps with the model and pools on the GPU: each decode graph a real torch.cuda.CUDAGraph of the
    whole model forward (our Triton kernels, SGLang's logits processor)."""
    path = checkpoint_factory(arch)
    with sglang_runtime(path):
        got, prefixes = decode_through_graphs(path, "cuda")
    assert_match_transformers(path, got, prefixes, 1e-4)
