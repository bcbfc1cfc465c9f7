"""Helpers of the SGLang frontend tests: real `sglang.Engine`s (on the GPU where there is one, else on CPU) and
atom-core's native engine."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from tests.frontends.native.hf_oracle import random_prompts

NEW_TOKENS = 12
# Small engines: float32 for exact parity, a few thousand KV slots, eager (no graphs). On CPU SGLang budgets
# mem_fraction_static of the machine's free memory for weights + KV cache and refuses to start when the loaded weights
# leave nothing (0.05 of a 24 GB CI machine was under SmolLM2's 0.5 GB + noise); max_total_tokens caps the pool.
# On a GPU machine (the carried SGLang build, tools/gpu_sglang) the same engines run eagerly on the GPU; the graph
# tests (test_graph_engine.py) turn SGLang's CUDA graphs on.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ENGINE_ARGS = dict(device=DEVICE, dtype="float32", mem_fraction_static=0.25, max_total_tokens=4096,
                   max_running_requests=8, disable_cuda_graph=True, skip_tokenizer_init=True,
                   log_level="warning")
# SGLang's CUDA graphs on (the GPU tests): full decode graphs up to batch 8, so a batch of 5 prompts replays the graph
# of 8 with padding rows; breakable prefill graphs (SGLang's default on CUDA) unless a test turns them off.
GRAPHS = dict(device="cuda", disable_cuda_graph=False, cuda_graph_max_bs_decode=8)


def followup_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """A second round: the 40- and 64-token prompts (conftest's prompts[2:4]) with new tails, whose prefixes the
    radix cache holds after the first round."""
    return [p + tail for p, tail in zip(prompts[2:4], random_prompts([5, 11], seed=3))]


def native_greedy(path, prompts: list[list[int]], max_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """atom-core's own engine, in this process that sglang.Engine has marked as SGLang's: the native
    engine's explicit host scope must win over that process-wide claim."""
    from atom_frontends.native import LLM, SamplingParams

    llm = LLM(str(path), block_size=8)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@contextlib.contextmanager
def sglang_engine(path, **overrides):
    """A real sglang.Engine on DEVICE (atom-core's models through SGLANG_EXTERNAL_MODEL_PACKAGE)."""
    import sglang

    engine = sglang.Engine(model_path=str(path), **{**ENGINE_ARGS, **overrides})
    try:
        yield engine
    finally:
        engine.shutdown()


def cpu_ranks_env(monkeypatch, tmp_path: Path, ranks: int) -> None:
    """What SGLang 0.5.23's CPU path needs to start several ranks (docs/sglang.md, Parallelism): SGLANG_NCCL_SO_PATH
    pointing at no file (no PyNccl on the CPU device) and SGLANG_CPU_OMP_THREADS_BIND, one CPU per rank (it refuses
    more ranks than NUMA nodes otherwise)."""
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("SGLANG_NCCL_SO_PATH", str(tmp_path / "none"))
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "|".join(str(cpus[r % len(cpus)]) for r in range(ranks)))


def generate(engine, prompts: list[list[int]], max_tokens: int = NEW_TOKENS, ignore_eos: bool = False) -> list[dict]:
    """Greedy generation; each result has output_ids and meta_info (cached_tokens, ...)."""
    params = {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": ignore_eos}
    return engine.generate(input_ids=prompts, sampling_params=params)


def build_gpt2_checkpoint(path: Path) -> Path:
    """A tiny GPT-2: an architecture atom-core lacks, whose SGLang model runs on CPU (no RoPE kernels)."""
    import torch
    import transformers

    from atom_frontends.native.demo import byte_level_tokenizer

    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512, vocab_size=320,
                                     initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).to(torch.float32).save_pretrained(path, safe_serialization=True)
    byte_level_tokenizer().save_pretrained(path)
    return path
