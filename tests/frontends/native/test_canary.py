"""The canary: with one op broken on purpose (through the dispatcher's public register()), the parity
comparison of every scenario must fail. A parity test that passes with attention returning zeros, a KV write
storing nothing or rotary as the identity checks nothing (tests/broken_ops.py)."""

from __future__ import annotations

import pytest

from tests.broken_ops import BREAKS, broken
from tests.frontends.native.test_parity import SCENARIOS
from tests.frontends.native.test_smollm2 import smollm2_parity


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("op", list(BREAKS))
def test_parity_catches_a_broken_op(checkpoint_factory, op, scenario):
    with broken(op):
        ours, want = SCENARIOS[scenario](checkpoint_factory)
    assert ours != want, f"the {scenario} parity check still passes with {op} broken"


@pytest.mark.parametrize("op", ["rotary", "kv_write"])
def test_real_weight_parity_catches_a_broken_op(smollm2, smollm2_oracle, op):
    """SmolLM2's real weights too (test_smollm2.py): the trained model's answers change with the op broken."""
    with broken(op):
        ours, want = smollm2_parity(smollm2, smollm2_oracle)
    assert ours != want, f"the SmolLM2 parity check still passes with {op} broken"


def test_ops_are_restored_after_a_break():
    import torch

    from atom_kernels import dispatch

    cpu = torch.device("cpu")
    before = {op: dispatch.get(op, cpu) for op in dispatch.OPS}
    with broken("kv_write", "cpu"):
        assert dispatch.get("write_kv_cache", cpu).__name__ == "kv_write_nothing"
    assert {op: dispatch.get(op, cpu) for op in dispatch.OPS} == before
