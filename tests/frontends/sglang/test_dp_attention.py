"""SGLang's DP attention on CPU: a real sglang.Engine with tp_size=2, dp_size=2, enable_dp_attention (attention-TP
size 1: each of the two scheduler processes attends its own requests) runs atom-core's Qwen3-MoE and DeepSeek-V3
(MLA, a dense first layer, shared experts), the MoE experts split over both processes (--ep-size 2: half the
experts each; without it: half of every expert's intermediate dim), every rank's tokens gathered before the experts
and scattered back after through SGLang's own DP gather/scatter; float32 greedy tokens == transformers. SGLang's own
Qwen3-MoE / DeepSeek do not run on a CPU-only machine (their rope imports vLLM's op), so transformers is the oracle.

The requests go round robin to the two DP ranks, rank 1's with fewer new tokens: rank 1 then runs IDLE batches while
rank 0 decodes on (its collectives still matched); the engines' MoE-call log shows extend and decode steps, both of
SGLang's DP paddings (SUM_LEN, MAX_LEN) and IDLE steps. The canary drops every other rank's tokens in the gather (each
rank's experts then see only its own tokens): the tokens differ from the reference.

SGLang's CPU path runs this only with a few changes to its processes (tests/frontends/sglang/dp_models/entry.py,
the engines' external model package, says which and why), and with SGLANG_NCCL_SO_PATH pointing nowhere (its TP group
otherwise builds a PyNccl communicator on the CPU device and fails) and SGLANG_CPU_OMP_THREADS_BIND (one CPU per
rank: SGLang refuses more ranks than NUMA nodes without it).
"""

from __future__ import annotations

import socket
from collections import Counter

import pytest

from tests.frontends.native.hf_oracle import hf_greedy
from tests.frontends.sglang.helpers import NEW_TOKENS, cpu_ranks_env, sglang_engine

pytestmark = pytest.mark.slow

DP_MODELS = "tests.frontends.sglang.dp_models"
QWEN3_MOE = ("Qwen3MoeForCausalLM", dict(num_experts_per_tok=3, num_hidden_layers=3, mlp_only_layers=[1]))
DEEPSEEK_V3 = ("DeepseekV3ForCausalLM", {})
DP = dict(tp_size=2, dp_size=2, enable_dp_attention=True, load_balance_method="round_robin")
CASES = {  # name → (checkpoint, engine arguments)
    "qwen3-moe-ep2": (QWEN3_MOE, dict(DP, ep_size=2)),
    "qwen3-moe-moe-tp": (QWEN3_MOE, DP),
    "deepseek-v3-ep2": (DEEPSEEK_V3, dict(DP, ep_size=2)),
}
# per prompt (conftest's 5, round robin: 0, 2, 4 on DP rank 0): rank 1's requests end early, and it idles
SHORT = 4
MAX_TOKENS = [NEW_TOKENS, SHORT, NEW_TOKENS, SHORT, NEW_TOKENS]


@pytest.fixture
def dp_env(monkeypatch, tmp_path):
    """The environment the engines' processes inherit (the module doc); the MoE-call log's path."""
    log = tmp_path / "moe_calls"
    cpu_ranks_env(monkeypatch, tmp_path, 2)
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", DP_MODELS)
    monkeypatch.setenv("DP_TEST_LOG", str(log))
    return monkeypatch, log


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(path, prompts, **engine_args) -> list[list[int]]:
    params = [{"temperature": 0.0, "max_new_tokens": n} for n in MAX_TOKENS]
    # a port of its own: after a DP-attention engine shuts down, this process keeps one of the ports SGLang derives
    # from the default one (port_base), and the next engine on the default would wait for it and fail
    with sglang_engine(path, attention_backend="atom", port=_free_port(), **engine_args) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
    return [o["output_ids"] for o in outs]


def _reference(path, prompts) -> list[list[int]]:
    return [tokens[:n] for tokens, n in zip(hf_greedy(path, prompts, NEW_TOKENS), MAX_TOKENS)]


def _moe_calls(log) -> Counter:
    calls: Counter = Counter()
    for rank in (0, 1):
        for line in (log.parent / f"{log.name}.{rank}").read_text().splitlines():
            dp_rank, mode, padding, rows = line.split()
            calls[int(dp_rank), mode, padding, int(rows) > 0] += 1
    return calls


@pytest.mark.parametrize("name", list(CASES))
def test_dp_attention_greedy_tokens_match_transformers(checkpoint_factory, prompts, dp_env, name):
    (arch, overrides), engine_args = CASES[name]
    path = checkpoint_factory(arch, **overrides)
    _, log = dp_env
    assert _run(path, prompts, **engine_args) == _reference(path, prompts)
    calls = _moe_calls(log)
    assert {(dp, mode) for dp, mode, _, _ in calls} >= {(0, "EXTEND"), (0, "DECODE"), (1, "EXTEND"), (1, "IDLE")}
    assert {padding for _, _, padding, _ in calls} == {"SUM_LEN", "MAX_LEN"}, calls


def test_dp_attention_canary_dropping_other_ranks_tokens_fails(checkpoint_factory, prompts, dp_env):
    monkeypatch, _ = dp_env
    monkeypatch.setenv("DP_CANARY_DROP_REMOTE_TOKENS", "1")
    (arch, overrides), engine_args = CASES["qwen3-moe-ep2"]
    path = checkpoint_factory(arch, **overrides)
    assert _run(path, prompts, **engine_args) != _reference(path, prompts)
