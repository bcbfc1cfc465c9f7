"""The runtime bridge with two models in one process: a Llama forward runs inside a Qwen3 forward
(as a draft model's step could), each on its own real SGLang pools and atom backend. Each model
sees only its own batch and metadata, the outer one gets its state back, nothing outlives the
forwards, and both models' logits equal transformers' (prefill, then a decode step over each
model's own KV cache). On helpers.DEVICE, transformers too (on a GPU machine: CUDA pools, our Triton kernels; CPU
pools there would take SGLang's CUDA KV-write path)."""

from __future__ import annotations

import pytest
import torch

from tests.frontends.sglang.batches import Requests, load_sglang_model, make_runner, sglang_runtime
from tests.frontends.sglang.helpers import DEVICE


def _hf_last_logits(path, tokens: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    with torch.inference_mode():
        return model.to(DEVICE).eval()(torch.tensor([tokens], device=DEVICE)).logits[0, -1]


class Served:
    """One model with its own pools, atom backend and request."""

    def __init__(self, path, tokens: list[int]) -> None:
        from atom_frontends.sglang.backend import create_backend

        self.path, self.tokens = path, tokens
        self.model = load_sglang_model(path).to(DEVICE)
        cfg = self.model.config
        self.runner = make_runner(cfg.num_hidden_layers, cfg.num_key_value_heads,
                                  cfg.hidden_size // cfg.num_attention_heads, device=DEVICE)
        self.backend = create_backend(self.runner)
        self.requests = Requests(self.runner)
        self.rid = self.requests.add(tokens)

    def forward(self, start: int, end: int):
        """Logits of the last token of tokens[start:end] (an EXTEND over a cached prefix, or a DECODE)."""
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        fb = self.requests.batch({self.rid: (start, end)})
        self.backend.init_forward_metadata(fb)
        with forward_context(ForwardContext(attn_backend=self.backend)):
            return self.model(fb.input_ids, fb.positions, fb).next_token_logits[0]


def test_nested_models_keep_their_own_state(sglang_checkpoint):
    from atom_core.forward_context import get_forward_context
    from atom_frontends.sglang.bridge import current_forward_batch

    qwen_path, llama_path = sglang_checkpoint("qwen3"), sglang_checkpoint("llama")
    with sglang_runtime(qwen_path):
        outer = Served(qwen_path, [5, 17, 99, 3, 250, 41, 8, 13])
        inner = Served(llama_path, [7, 200, 31, 64, 9])
        seen: dict = {}

        def run_inner_model(module, args):
            """Pre-hook of the outer model's last decoder layer: the inner model's whole forward."""
            ctx = get_forward_context()
            seen["outer_md"] = ctx.attn_metadata is outer.backend.forward_metadata
            seen["outer_before"] = current_forward_batch()
            seen["inner_prefill"] = inner.forward(0, len(inner.tokens) - 1)
            seen["outer_after"] = current_forward_batch()
            seen["outer_md_after"] = get_forward_context().attn_metadata is outer.backend.forward_metadata

        hook = outer.model.core.model.layers[-1].register_forward_pre_hook(run_inner_model)
        outer_prefill = outer.forward(0, len(outer.tokens) - 1)
        hook.remove()
        # one decode step each, interleaved, over their own caches
        inner_decode = inner.forward(len(inner.tokens) - 1, len(inner.tokens))
        outer_decode = outer.forward(len(outer.tokens) - 1, len(outer.tokens))

    assert seen["outer_md"] and seen["outer_md_after"]
    assert seen["outer_before"] is seen["outer_after"]  # the outer batch is back after the inner forward
    assert seen["outer_before"].input_ids.shape[0] == len(outer.tokens) - 1
    with pytest.raises(RuntimeError, match="outside an SGLang forward"):
        current_forward_batch()  # nothing leaks out of the forwards
    checks = [(outer_prefill, qwen_path, outer.tokens[:-1]), (outer_decode, qwen_path, outer.tokens),
              (seen["inner_prefill"], llama_path, inner.tokens[:-1]), (inner_decode, llama_path, inner.tokens)]
    for logits, path, tokens in checks:
        torch.testing.assert_close(logits, _hf_last_logits(path, tokens), atol=2e-5, rtol=1e-5)
