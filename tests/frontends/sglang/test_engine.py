"""A real sglang.Engine on CPU with atom-core's models (SGLANG_EXTERNAL_MODEL_PACKAGE) and attention
backend ("atom"): greedy tokens == transformers == atom-core's native engine, for Qwen3 and Llama,
prompts of several lengths in one batch, then prompts extending cached ones (radix-cache hits).
An architecture atom-core lacks still runs, on SGLang's own model."""

from __future__ import annotations

import pytest

from tests.frontends.native.hf_oracle import hf_greedy, random_prompts
from tests.frontends.sglang.helpers import (
    NEW_TOKENS,
    build_gpt2_checkpoint,
    generate,
    native_greedy,
    sglang_engine,
)

pytestmark = pytest.mark.slow

ENGINES = {
    "qwen3": {},
    # 16-token prefill chunks next to running decodes: chunked prefill and MIXED batches
    "llama": dict(chunked_prefill_size=16, enable_mixed_chunk=True),
}


@pytest.mark.parametrize("name", list(ENGINES))
def test_greedy_tokens_match_transformers_and_native(sglang_checkpoint, prompts, name):
    path = sglang_checkpoint(name)
    # second round: the 40- and 64-token prompts plus new tails, which the radix cache has seen
    followups = [p + tail for p, tail in zip(prompts[2:4], random_prompts([5, 11], seed=3))]
    with sglang_engine(path, attention_backend="atom", **ENGINES[name]) as engine:
        first = generate(engine, prompts)
        second = generate(engine, followups)
    expected = hf_greedy(path, prompts + followups, NEW_TOKENS)
    assert [o["output_ids"] for o in first + second] == expected
    assert native_greedy(path, prompts + followups) == expected
    cached = [o["meta_info"]["cached_tokens"] for o in second]
    assert all(c >= len(p) for c, p in zip(cached, prompts[2:4])), cached


def test_unsupported_architecture_runs_on_sglangs_own_model(tmp_path, prompts):
    from sglang.srt.models.registry import ModelRegistry

    from atom_core.models import is_supported

    assert not is_supported("GPT2LMHeadModel"), "pick an architecture atom-core lacks for this test"
    path = build_gpt2_checkpoint(tmp_path / "gpt2")
    model_cls, _ = ModelRegistry.resolve_model_cls(["GPT2LMHeadModel"])
    assert model_cls.__module__ == "sglang.srt.models.gpt2"  # SGLang's model, not ours
    with sglang_engine(path, attention_backend="atom") as engine:  # SGLang's layers on our backend
        out = generate(engine, prompts)
    assert [o["output_ids"] for o in out] == hf_greedy(path, prompts, NEW_TOKENS)
