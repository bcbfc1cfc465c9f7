"""KV cache sizing: max_model_len, when not given, is lowered to what the KV cache holds (one log line), so the
engine starts with default arguments on the configs of real checkpoints (random weights at the real shapes,
bfloat16) on a CPU machine as on a GPU."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
import transformers

# The fields of the real checkpoints' config.json that set shapes, lengths and rope.
REAL_CONFIGS = {
    "Qwen3-0.6B": ("Qwen3ForCausalLM", dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, vocab_size=151936,
        rope_theta=1000000, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643,
        eos_token_id=151645)),
    "Llama-3.2-1B": ("LlamaForCausalLM", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, vocab_size=128256,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000,
        eos_token_id=128001, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=8192))),
}
SHARD_BYTES = 512 << 20


def test_max_model_len_lowered_to_what_the_kv_cache_holds(checkpoint_factory, caplog):
    from atom_frontends.native import LLM, SamplingParams
    from tests.frontends.native.hf_oracle import hf_greedy, random_prompts

    path = checkpoint_factory("LlamaForCausalLM", initializer_range=0.1)  # max_position_embeddings=512
    with caplog.at_level(logging.INFO, logger="atom_frontends.native.engine"):
        llm = LLM(path, num_kv_blocks=5, block_size=16)
    (record,) = [r for r in caplog.records if "KV cache" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "max_model_len=80, lowered from the checkpoint's 512 as the KV cache holds 80 tokens" in record.getMessage()
    assert llm.engine.config.max_model_len == 80
    assert llm.engine.runner.inputs.width == 16  # block-table width of the lowered length (5 blocks → 16)
    with pytest.raises(ValueError, match="max_model_len=80 leaves no room"):
        llm.generate([[5] * 80], use_tqdm=False)
    prompt = random_prompts([70], seed=3)[0]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True), use_tqdm=False)[0]
    c = out.outputs[0]
    assert c.finish_reason == "length" and c.token_ids == hf_greedy(path, [prompt], 10)[0]  # the cache, full


def write_checkpoint(path, arch: str, fields: dict, seed: int = 0, std: float = 0.1):
    """A HF checkpoint of `arch` at the shapes of `fields`: seeded random bfloat16 tensors under the names
    transformers uses (taken from the model built on the meta device), in shards with an index, plus the
    byte-level tokenizer (ids < 260 fit any vocabulary). Returns the config."""
    from safetensors.torch import save_file

    from atom_frontends.native.demo import byte_level_tokenizer

    config = getattr(transformers, arch.replace("ForCausalLM", "Config"))(
        **fields, architectures=[arch], dtype="bfloat16", initializer_range=std)
    with torch.device("meta"):
        shapes = {n: t.shape for n, t in getattr(transformers, arch)(config).state_dict().items()}
    if config.tie_word_embeddings:
        del shapes["lm_head.weight"]
    gen = torch.Generator().manual_seed(seed)
    weight_map, shard, shard_bytes = {}, {}, 0

    def flush():
        name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, os.path.join(path, name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        shard.clear()

    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            shard[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            shard[name] = torch.empty(shape, dtype=torch.bfloat16).normal_(0, std, generator=gen)
        shard_bytes += shard[name].nbytes
        if shard_bytes >= SHARD_BYTES:
            flush()
            shard_bytes = 0
    if shard:
        flush()
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    config.save_pretrained(path)
    byte_level_tokenizer().save_pretrained(path)
    return config


@pytest.fixture(scope="module", params=list(REAL_CONFIGS))
def real_checkpoint(request, tmp_path_factory):
    """(path, config) of a real-shape checkpoint, deleted after this module's tests (GBs of disk)."""
    arch, fields = REAL_CONFIGS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    config = write_checkpoint(path, arch, fields)
    yield path, config
    shutil.rmtree(path)


@pytest.mark.slow
def test_llm_starts_with_default_arguments(real_checkpoint, caplog):
    from atom_frontends.native import LLM, SamplingParams

    path, config = real_checkpoint
    with caplog.at_level(logging.INFO, logger="atom_frontends.native.engine"):
        llm = LLM(path)
    engine = llm.engine
    max_len, blocks = engine.config.max_model_len, engine.runner.num_blocks
    assert engine.config.dtype == torch.bfloat16
    assert 0 < max_len <= config.max_position_embeddings
    assert max_len <= blocks * engine.config.block_size  # a sequence of max_model_len tokens fits in the cache
    (record,) = [r for r in caplog.records if "KV cache" in r.getMessage()]  # one line says it
    assert f"max_model_len={max_len}" in record.getMessage() and f"{blocks} blocks" in record.getMessage()
    if max_len < config.max_position_embeddings:
        assert record.levelno == logging.WARNING and str(config.max_position_embeddings) in record.getMessage()
    with pytest.raises(ValueError, match=f"max_model_len={max_len} leaves no room"):
        llm.generate([[5] * max_len], use_tqdm=False)
    prompt = [5, 17, 42, 9, 100, 7, 3, 250]
    tokens = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                          use_tqdm=False)[0].outputs[0].token_ids
    assert len(tokens) == 4
    del llm, engine  # frees the weights and the KV cache before transformers loads its copy
    gc.collect()
    torch.cuda.empty_cache()  # on a GPU, for the CLI's process next (a no-op without CUDA)
    # Outside check: transformers, fed the same tokens, ranks each greedy token of ours at (or within bfloat16
    # noise of) its top. A wrong token sits ~4 logit standard deviations below the top among ~150k candidates.
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()  # [4, vocab]
    gap = logits.max(dim=-1).values - logits[torch.arange(len(tokens)), tokens]
    assert (gap <= 0.25 * logits.std(dim=-1)).all(), (gap, logits.std(dim=-1))


@pytest.mark.slow
def test_cli_starts_with_default_arguments(real_checkpoint, tmp_path):
    path, config = real_checkpoint
    exe = shutil.which("atom-core") or os.path.join(os.path.dirname(sys.executable), "atom-core")
    r = subprocess.run([exe, "generate", "--model", str(path), "--prompt", "Hello", "--max-tokens", "3"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, ATOM_CACHE_DIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert "KV cache" in r.stderr and "max_model_len=" in r.stderr
    assert "tokens: 3" in r.stdout or "finish_reason: stop" in r.stdout


@pytest.mark.gpu
def test_engines_one_after_another_size_their_kv_cache_from_free_memory(checkpoint_factory):
    """The second engine's default cache must not trip over the first one's memory, still cached by torch."""
    from atom_frontends.native import LLM, SamplingParams

    path = checkpoint_factory("Qwen3ForCausalLM")
    for block_size in (16, 4):  # other block sizes: other tensor sizes than the cached segments
        llm = LLM(path, block_size=block_size)
        out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)[0]
        assert len(out.outputs[0].token_ids) == 4
        del llm, out


def test_cgroup_limit_caps_the_memory_a_container_sees(tmp_path):
    from atom_frontends.native.kv_memory import _cgroup_room

    assert _cgroup_room(tmp_path) is None  # no cgroup files: no limit known
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1: no limit
    (tmp_path / "memory" / "memory.usage_in_bytes").write_text("5000\n")
    assert _cgroup_room(tmp_path) is None
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("8000\n")
    assert _cgroup_room(tmp_path) == 3000
    (tmp_path / "memory.max").write_text("max\n")  # v2 without a limit, v1 files left: v1 decides
    (tmp_path / "memory.current").write_text("100\n")
    assert _cgroup_room(tmp_path) == 3000
    (tmp_path / "memory.max").write_text("1000\n")
    assert _cgroup_room(tmp_path) == 900
