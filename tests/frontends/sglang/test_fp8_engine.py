"""An FP8 checkpoint in a real sglang.Engine on CPU (atom-core's model through SGLANG_EXTERNAL_MODEL_PACKAGE, our
attention backend): SGLang's Fp8Config is translated, not refused. A DeepSeek-V3-shaped model (MLA + MoE + shared
expert, its MTP layer as released) in the fp8 block format.

SGLang takes FP8 checkpoints in bfloat16/float16 only, and in bfloat16 these random-weight models' greedy tokens
leave a float32 oracle's within a few tokens (rounding, not a bug): so the reference here is atom-core's native engine
in bfloat16 on the same checkpoint, whose float32 tokens equal transformers' (native/test_fp8_parity.py)."""

from __future__ import annotations

import pytest

from tests.fp8_checkpoints import DEEPSEEK_V3
from tests.frontends.native.hf_oracle import random_prompts
from tests.frontends.sglang.helpers import generate, sglang_engine

pytestmark = pytest.mark.slow

NEW_TOKENS = 12
PROMPTS = random_prompts([5, 17, 9], seed=3)


def _native_bf16(path) -> list[list[int]]:
    from atom_frontends.native import LLM, SamplingParams

    llm = LLM(str(path), dtype="bfloat16", block_size=8)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_fp8_deepseek_v3_matches_the_native_engine(fp8_checkpoint):
    path, _ = fp8_checkpoint(DEEPSEEK_V3, "block", True)
    with sglang_engine(path, attention_backend="atom", dtype="bfloat16") as engine:
        ours = [o["output_ids"] for o in generate(engine, PROMPTS, NEW_TOKENS)]
    assert ours == _native_bf16(path)
