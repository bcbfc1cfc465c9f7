"""A GGUF other than SmolLM2's: random Qwen3 and Llama checkpoints written with the gguf package's writer (Q8_0 and
F16 weights, Llama's q/k rows permuted as llama.cpp does), loaded by the native engine from the .gguf file: greedy
tokens == transformers loading the same file with its own GGUF reader, in float32."""

from __future__ import annotations

import pytest
import torch

from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import informative_greedy, random_prompts
from tests.gguf_files import write_gguf

NEW_TOKENS = 24
# transformers' GGUF config for qwen3 does not read attention.key_length: it takes Qwen3Config's head_dim, 128 (as
# every released Qwen3 has). The random Qwen3 has that head_dim, so both readers build the same model.
OVERRIDES = {"Qwen3ForCausalLM": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=128),
             "LlamaForCausalLM": {}}


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "LlamaForCausalLM"])
def test_written_gguf_greedy_equals_transformers_gguf_load(checkpoint_factory, tmp_path, monkeypatch, arch):
    from transformers import AutoConfig, AutoModelForCausalLM

    ckpt = checkpoint_factory(arch, **OVERRIDES[arch])
    gguf = write_gguf(tmp_path / f"{arch}.gguf", ckpt, AutoConfig.from_pretrained(ckpt))
    monkeypatch.setenv("ATOM_CACHE_DIR", str(tmp_path / "cache"))
    prompts = random_prompts([5, 19, 33], seed=4)
    outs = LLM(str(gguf), dtype="float32", block_size=8).generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf.name, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    hf.generation_config.eos_token_id = None  # the engine ran with ignore_eos
    want = informative_greedy(hf, prompts, NEW_TOKENS, gguf)
    assert [o.outputs[0].token_ids for o in outs] == want
