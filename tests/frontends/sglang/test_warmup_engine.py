"""Start-up kernel warm-up in a real sglang.Engine on CPU (atom-core's models, our attention backend).

SGLang's scheduler process must have kernel_warmup's warm_up run every attention layer once, on the very cache
views of SGLang's pool that the layer's serving steps then read, with the model's dtype and SGLang's own bounds
(its context length; the most tokens one extend step runs), and the model's MoE layers once; all of it while
the engine starts, none of it in a serving step. On CPU the warm-up itself is a no-op (the dispatcher picks the
torch reference), so a spy (warmup_spy/sitecustomize.py, loaded by the processes SGLang spawns) logs the calls.
Full attention over SGLang's MHA pool (Qwen3, dense) and MLA over its latent pool (DeepSeek-V2, one MoE layer).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.frontends.sglang.helpers import ENGINE_ARGS, generate, sglang_engine

pytestmark = pytest.mark.slow

SPY = Path(__file__).with_name("warmup_spy")
CONTEXT = 128
CASES = {
    # chunked prefill on: no step runs more than chunked_prefill_size tokens
    "qwen3": ("Qwen3ForCausalLM", dict(chunked_prefill_size=16), 16),
    # off: a step's first request goes whole (up to the context length), the others within max_prefill_tokens
    "deepseek_v2": ("DeepseekV2ForCausalLM", dict(chunked_prefill_size=-1, max_prefill_tokens=300), 300),
}


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _started_engine_events(path, log: Path, monkeypatch, engine_args: dict, prompts) -> tuple[list, list]:
    """(events logged while the engine started, events of the generation that followed)."""
    monkeypatch.setenv("ATOM_WARMUP_SPY_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(SPY), os.environ.get("PYTHONPATH")])))
    with sglang_engine(path, attention_backend="atom", context_length=CONTEXT, **engine_args) as engine:
        started = _events(log)
        out = generate(engine, prompts, max_tokens=4)
    assert all(len(o["output_ids"]) == 4 for o in out)
    return started, _events(log)[len(started):]


@pytest.mark.parametrize("name", list(CASES))
def test_warm_up_runs_at_start_up_per_layer_on_the_pools_views(checkpoint_factory, prompts, tmp_path, monkeypatch,
                                                                name):
    arch, engine_args, step_budget = CASES[name]
    path = checkpoint_factory(arch)
    layers = json.loads((path / "config.json").read_text())["num_hidden_layers"]
    started, served = _started_engine_events(path, tmp_path / "spy.jsonl", monkeypatch, engine_args, prompts[:3])

    warm = [e for e in started if e["event"] == "warm_attention"]
    assert sorted(e["layer"] for e in warm) == [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    for e in warm:  # the engine's dtype and bounds; float KV: no scales
        assert (e["dtype"], e["bounds"], e["scales"]) == ("torch.float32", [CONTEXT, step_budget], [False, False])
        assert e["mla"] == (name == "deepseek_v2")
    moe_tokens = max(step_budget, ENGINE_ARGS["max_running_requests"])  # a decode step: one token per request
    assert [e for e in started if e["event"] == "warm_moe"] == [
        dict(event="warm_moe", moe_layers=int(name == "deepseek_v2"), dtype="torch.float32", max_tokens=moe_tokens)]
    assert len(started) == len(warm) + 1, "something but the warm-up ran attention while the engine started"

    assert served and {e["event"] for e in served} == {"serve"}, "a warm-up ran after start-up, in a serving step"
    views = {e["layer"]: e["caches"] for e in warm}
    for e in served:  # the same storage, offset, shape and strides: the pool's own views, block size 1
        assert e["caches"] == views[e["layer"]], e["layer"]
    assert {e["layer"] for e in served} == set(views)
    assert all(shape[1] == 1 for view in views.values() for _, _, shape, _, _ in view)
