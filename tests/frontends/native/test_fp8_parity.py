"""FP8 checkpoints on the native engine: greedy tokens == transformers in float32 on the dequantized weights with
the checkpoint's activation quantization simulated (tests/fp8_checkpoints.py); a first divergence is allowed only
where the oracle's own top-2 logits are within NEAR_TIE (the simulated 3-bit-mantissa roundings amplify a one-ulp
summation-order difference: transformers 4.x's DeepSeek MoE flips one such token, 5.x matches exactly).

Cases: Qwen3 in the fp8 block format (partial blocks, block-cut q|k|v shards), compressed-tensors per-channel with
dynamic per-token activations and with static per-tensor ones (also the vLLM test's Qwen3-MoE); Qwen3-MoE and a
DeepSeek-V3-shaped model (MLA + MoE + shared expert, with its MTP layer as released) in the block format. Under
transformers 4.x (the minimum-version session) only the MoE cases run: the dense layers' modules are the same there.
The canary: a scale ignored, a block of scales mis-indexed, or the activations left unquantized, and the parity
fails.
"""

from __future__ import annotations

import pytest
import torch

from atom_core.layers import fp8
from atom_frontends.native import LLM, SamplingParams
from tests.fp8_checkpoints import DEEPSEEK_V3, QWEN3, QWEN3_MOE, parity_failures
from tests.frontends.native.hf_oracle import random_prompts

NEW_TOKENS = 12
PROMPTS = random_prompts([5, 17, 9])
CASES = {
    "qwen3-block": (QWEN3, "block", False),
    "qwen3-channel": (QWEN3, "channel", False),
    "qwen3-channel-static": (QWEN3, "static", False),
    "qwen3-moe-block": (QWEN3_MOE, "block", False),
    "deepseek-v3-block-mtp": (DEEPSEEK_V3, "block", True),
}


def parity(fp8_checkpoint, case: str) -> list[tuple[int, int, float]]:
    """Our greedy tokens' divergences from the oracle's beyond near-ties (parity_failures) for CASES[case]."""
    checkpoint, fmt, mtp = CASES[case]
    path, dequantized = fp8_checkpoint(checkpoint, fmt, mtp)
    llm = LLM(str(path), dtype="float32", block_size=8, num_kv_blocks=256)  # small: runs beside other GPU tests
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS), use_tqdm=False)
    return parity_failures(dequantized, fmt, PROMPTS, [o.outputs[0].token_ids for o in outs], NEW_TOKENS)


@pytest.mark.parametrize("case", list(CASES))
def test_fp8_greedy_matches_transformers(fp8_checkpoint, case):
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5 and "moe" not in case and "deepseek" not in case:
        pytest.skip("transformers 4.x: the MoE cases only (CI time); its dense modules are 5.x's")
    assert not parity(fp8_checkpoint, case)


def test_weights_stay_fp8(fp8_checkpoint):
    """The linear layers and experts hold the checkpoint's e4m3 weights (not a dequantized copy); MLA's absorbed
    kv_b_proj alone is dequantized at load; the LM head and the routers keep the checkpoint's float weights."""
    path, _ = fp8_checkpoint(DEEPSEEK_V3, "block", True)
    model = LLM(str(path), dtype="float32", block_size=8).engine.runner.model
    params = dict(model.named_parameters())
    fp8 = {n for n, p in params.items() if p.dtype == torch.float8_e4m3fn}
    assert "model.layers.1.mlp.experts.gate_up_proj" in fp8 and "model.layers.0.self_attn.q_b_proj.weight" in fp8
    assert "model.layers.0.self_attn.kv_b_proj.weight" not in fp8
    assert "model.layers.0.self_attn.kv_b_proj.weight_scale" not in params
    assert params["lm_head.weight"].dtype == params["model.layers.1.mlp.gate.weight"].dtype == torch.float32
    scale = params["model.layers.0.mlp.gate_up_proj.weight_scale"]  # gate|up rows 2 * 320, K 256: 2 blocks
    assert tuple(scale.shape) == (640, 2) and scale.dtype == torch.float32


_EXPAND_SCALE = fp8.expand_scale


def _ignore_scales(scale, rows, cols, block, name):
    return torch.ones(rows, cols)


def _shift_blocks(scale, rows, cols, block, name):
    return _EXPAND_SCALE(scale, rows, cols, block, name).roll(1, dims=1)


def _weights_only(scheme, k):
    """act_group 0 for every layer: the layers hand their kernels unquantized activations (on every device and
    kernel path: the norm and SiLU prologues too)."""
    return 0


@pytest.mark.parametrize("break_", ["ignore_scales", "shift_blocks", "unquantized_activations"])
def test_fp8_parity_catches_broken_scales(fp8_checkpoint, monkeypatch, break_):
    if break_ == "unquantized_activations":
        monkeypatch.setattr(fp8, "act_group", _weights_only)
    else:
        monkeypatch.setattr(fp8, "expand_scale", {"ignore_scales": _ignore_scales,
                                                  "shift_blocks": _shift_blocks}[break_])
    failures = parity(fp8_checkpoint, "qwen3-block")
    assert failures, f"the FP8 parity check still passes with {break_}"
