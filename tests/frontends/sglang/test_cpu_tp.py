"""SGLang's tensor parallelism on CPU at TP 4 over a checkpoint with fewer KV heads (2) than ranks: SGLang's CPU path
pads the heads it hands the model up to the TP size (4 KV, 8 query heads; original_* keep the checkpoint's) and sizes
its KV pool from them. atom-core's layers split the checkpoint's heads (each KV head on two ranks) and its backend reads
its heads' slice of the pool (frontends/sglang/config.py _PADDED_HEADS); before that, loading failed ("start out of
range"). Float32 greedy tokens == transformers, dense and MoE (--ep-size 2: two ranks per expert shard).

The processes run as in test_dp_attention.py (helpers.cpu_ranks_env).
"""

from __future__ import annotations

import pytest

from tests.frontends.sglang.helpers import cpu_ranks_env
from tests.frontends.sglang.test_dp_attention import QWEN3_MOE, _reference, _run

pytestmark = pytest.mark.slow

CASES = {"qwen3": (("Qwen3ForCausalLM", {}), dict(tp_size=4)), "qwen3-moe-ep2": (QWEN3_MOE, dict(tp_size=4, ep_size=2))}


@pytest.mark.parametrize("name", list(CASES))
def test_tp4_with_fewer_kv_heads_than_ranks_matches_transformers(checkpoint_factory, prompts, monkeypatch, tmp_path,
                                                                 name):
    cpu_ranks_env(monkeypatch, tmp_path, 4)
    (arch, overrides), engine_args = CASES[name]
    path = checkpoint_factory(arch, **overrides)
    assert _run(path, prompts, **engine_args) == _reference(path, prompts)
