"""SGLang's --load-format dummy with atom-core's models: SGLang fills the parameters with random values from
config.json alone (no weight files) and calls the model's post_load_weights, where our wrapper readies the weights
as load_weights does (an fp8 MLA kv_b_proj dequantized, CPU GEMMs prepacked, the MoE kernels warmed)."""

from __future__ import annotations

import json

import pytest

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
    assert [len(o["output_ids"]) for o in out] == [4, 4]
