"""Fixtures for the SGLang frontend tests: tiny checkpoints, and the outside oracles' tokens.

The checkpoints use build_checkpoint's wide init (0.2, not transformers' 0.02, with which a tiny tied Qwen3
mostly repeats its last token, which any attention or none would reproduce); the transformers oracle
(hf_greedy) refuses a reference whose tokens do not vary.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("sglang", reason="the SGLang frontend tests need sglang (nox -s sglang installs it)")

# Read when sglang.srt.models.registry is first imported (here and in SGLang's subprocesses).
os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"] = "atom_frontends.sglang.models"

from tests.frontends.native.hf_oracle import random_prompts  # noqa: E402

CHECKPOINTS = {
    "qwen3": ("Qwen3ForCausalLM", {}),
    # an MLP 40 wide: SGLang's CPU path pads intermediate sizes to a multiple of 64 in the config it hands the model
    # (keeping original_intermediate_size); ours must build the checkpoint's 40 (as Qwen3-MoE's 32-wide experts)
    "llama": ("LlamaForCausalLM", {"intermediate_size": 40}),
}
PROMPT_LENGTHS = [3, 17, 40, 64, 9]


@pytest.fixture(autouse=True)
def _leave_host_unmarked():
    """sglang.Engine runs our plugin entry point in this process too, marking the host "sglang"
    process-wide; don't let that leak into other tests."""
    yield
    from atom_frontends.sglang.hooks import SGLANG

    SGLANG.deactivate_process()


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    return random_prompts(PROMPT_LENGTHS, seed=7)


@pytest.fixture(scope="session")
def sglang_checkpoint(checkpoint_factory):
    def make(name: str):
        arch, overrides = CHECKPOINTS[name]
        return checkpoint_factory(arch, **overrides)

    return make


@pytest.fixture(scope="session")
def atom_graph_tokens():
    """run(path, rounds, **engine_args) → per round (prompt lists generated one after the other on one engine), the
    outputs of atom-core's model on our backend with SGLang's CUDA graphs on (helpers.GRAPHS). Cached per arguments for
    the session: test_own_model_gpu.py reuses test_graph_engine.py's engines of the same configuration (each start
    costs a minute or more of GPU time)."""
    from tests.frontends.sglang.helpers import GRAPHS, generate, sglang_engine

    cache: dict = {}

    def run(path, rounds: list[list[list[int]]], **engine_args) -> list[list[dict]]:
        key = (str(path), repr(rounds), repr(sorted(engine_args.items())))
        if key not in cache:
            with sglang_engine(path, attention_backend="atom", **GRAPHS, **engine_args) as engine:
                cache[key] = [generate(engine, prompts) for prompts in rounds]
        return cache[key]

    return run
