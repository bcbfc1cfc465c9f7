"""SGLang's --load-format dummy with atom-core's models: SGLang fills the parameters with random values from
config.json alone (no weight files) and calls the model's post_load_weights, where our wrapper readies the weights
as load_weights does (an fp8 MLA kv_b_proj dequantized, CPU GEMMs prepacked, the MoE kernels warmed), after drawing
the weights again as the native engine does (SGLang's dummy values leave e4m3 weights ~all zero and our scales of
either sign): checked on what the rank holds (get_weights_by_name)."""

from __future__ import annotations

import json

import pytest
import torch

from atom_core.dummy_weights import FP8_RANGE, HIGH
from tests.fp8_checkpoints import FORMATS
from tests.frontends.native.test_dummy_load import config_only
from tests.frontends.sglang.helpers import generate, sglang_engine

pytestmark = pytest.mark.slow

CASES = {  # name → (architecture, quantization_config, dtype: SGLang takes FP8 checkpoints in 16-bit models only)
    "qwen3": ("Qwen3ForCausalLM", None, "float32"),
    "deepseek-v3-fp8": ("DeepseekV3ForCausalLM", FORMATS["block"], "bfloat16"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_dummy_weights_serve_from_the_config_alone(tmp_path, name):
    arch, quantization, dtype = CASES[name]
    path = config_only(tmp_path, arch, quantization)
    assert ("quantization_config" in json.loads((path / "config.json").read_text())) == (quantization is not None)
    with sglang_engine(path, attention_backend="atom", load_format="dummy", dtype=dtype) as engine:
        out = generate(engine, [[1, 2, 3, 4, 5], [7, 8]], max_tokens=4)
        held = {name: engine.get_weights_by_name(f"core.{name}", truncate_size=4096) for name in _probed(path)}
    assert [len(o["output_ids"]) for o in out] == [4, 4]
    for name, values in held.items():  # what the rank holds: atom_core.dummy_weights', not SGLang's [-1e-3, 1e-3]
        assert values, f"{name}: get_weights_by_name returned nothing"
        if "scale" in name.rsplit(".", 1)[-1]:
            assert all(v == pytest.approx(HIGH / FP8_RANGE) for v in values), name
        else:  # e4m3: spanning the format (SGLang's dummy values round to e4m3 zero)
            assert max(abs(v) for v in values) > 100, name


def _probed(path) -> list[str]:
    """An e4m3 weight and its scale of the same model built natively (atom-core's parameter names), if it has any."""
    from atom_frontends.native import LLM

    llm = LLM(str(path), load_format="dummy", dtype="bfloat16", max_model_len=64, num_kv_blocks=16)
    fp8 = [n for n, p in llm.engine.model.named_parameters() if p.dtype == torch.float8_e4m3fn]
    return [fp8[0], fp8[0].rsplit(".", 1)[0] + ".weight_scale"] if fp8 else []
