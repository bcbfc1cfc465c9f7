"""Bad input → a clear ValueError/TypeError; the engine keeps serving everything else."""

from __future__ import annotations

import pytest

from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import hf_greedy, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def llm_and_path(checkpoint_factory):
    path = checkpoint_factory("Qwen3ForCausalLM")
    return LLM(path, max_model_len=64, block_size=4), path


@pytest.mark.parametrize("prompt, error, words", [
    (list(range(3, 70)), ValueError, "max_model_len=64"),
    ([], ValueError, "empty"),
    ("", ValueError, "empty"),
    ([5, 9999], ValueError, "outside the vocabulary"),
    ([5, -1], ValueError, "outside the vocabulary"),
    (3.5, TypeError, "str or a list of int"),
    ([1, "a"], TypeError, "str or a list of int"),
])
def test_bad_prompt(llm_and_path, prompt, error, words):
    llm, _ = llm_and_path
    with pytest.raises(error, match=words):
        llm.generate([[5, 6, 7], prompt], GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished()  # nothing half-queued


BAD_PARAMS = [  # (field, bad value, error, words of the message)
    ("max_tokens", 0, ValueError, "max_tokens must be an int >= 1"),
    ("max_tokens", True, TypeError, "max_tokens must be an int"),
    ("temperature", -0.5, ValueError, "temperature must be >= 0"),
    ("temperature", float("nan"), ValueError, "temperature must be >= 0"),
    ("temperature", "hot", TypeError, "temperature must be a number"),
    ("top_p", 0.0, ValueError, r"top_p must be in \(0, 1\]"),
    ("top_p", 1.5, ValueError, r"top_p must be in \(0, 1\]"),
    ("top_p", "x", TypeError, "top_p must be a number"),
    ("top_k", -3, ValueError, "top_k must be -1/0"),
    ("top_k", 2.5, TypeError, "top_k must be an int"),
    ("min_tokens", 99, ValueError, r"min_tokens must be an int in \[0, max_tokens=16\]"),
    ("stop_token_ids", [-2], ValueError, "stop_token_ids must be non-negative ints"),
    ("stop_token_ids", [1, "a"], ValueError, "stop_token_ids must be non-negative ints"),
    ("stop_token_ids", None, TypeError, "stop_token_ids must be a list of ints"),
    ("ignore_eos", "yes", TypeError, "ignore_eos must be a bool"),
    ("seed", 1.5, TypeError, "seed must be an int or None"),
]


@pytest.mark.parametrize("field, value, error, words", BAD_PARAMS)
def test_bad_sampling_params(field, value, error, words):
    with pytest.raises(error, match=f"SamplingParams.{words}"):
        SamplingParams(**{field: value})


def _mutated(field, value):
    sp = SamplingParams(temperature=0.0, max_tokens=16)
    setattr(sp, field, value)  # dataclass fields can change after construction
    return sp


@pytest.mark.parametrize("field, value, error, words", BAD_PARAMS)
def test_params_changed_after_construction_are_checked_before_queueing(llm_and_path, field, value, error, words):
    llm, _ = llm_and_path
    with pytest.raises(error, match=f"^sampling_params\\[2\\]: SamplingParams.{words}"):
        llm.generate([[5, 6], [7, 8], [9, 10]], [GREEDY, GREEDY, _mutated(field, value)], use_tqdm=False)
    assert not llm.engine.has_unfinished()
    with pytest.raises(error, match=f"^sampling_params: SamplingParams.{words}"):  # one for every prompt
        llm.generate([[5, 6], [7, 8]], _mutated(field, value), use_tqdm=False)
    assert not llm.engine.has_unfinished()
    with pytest.raises(error, match=f"^SamplingParams.{words}"):
        llm.engine.add_request([5, 6], _mutated(field, value))
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize("prompts, params, error, words", [
    ([[5, 6], [7, 8]], [GREEDY, dict(temperature=0)], TypeError,
     r"^sampling_params\[1\]: params must be SamplingParams, got dict"),
    ([[5, 6], [7, 8]], "greedy", TypeError, "^sampling_params must be a SamplingParams or a list"),
    ([[5, 6], [7, 8]], [GREEDY], ValueError, "got 1 SamplingParams for 2 prompts"),
    ([[5, 6], [7, 8], []], [GREEDY, GREEDY, GREEDY], ValueError, "^prompt 2: the prompt is empty"),
    (None, GREEDY, TypeError, "^prompts must be a str, a list of token ids or a list of those"),
])
def test_bad_generate_arguments_queue_nothing(llm_and_path, prompts, params, error, words):
    llm, _ = llm_and_path
    with pytest.raises(error, match=words):
        llm.generate(prompts, params, use_tqdm=False)
    assert not llm.engine.has_unfinished()


def test_queued_request_keeps_its_params(llm_and_path):
    """A request keeps a copy of its SamplingParams: changing the object afterwards does not reach it."""
    llm, _ = llm_and_path
    sp = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    rid = llm.engine.add_request([5, 6, 7], sp)
    sp.max_tokens, sp.temperature = 1, -1.0
    done = {}
    while llm.engine.has_unfinished():
        done.update({o.request_id: o for o in llm.engine.step()})
    assert len(done[rid].outputs[0].token_ids) == 5


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(num_kv_blocks=8, kv_cache_memory=1 << 20), ValueError, "set num_kv_blocks or kv_cache_memory, not both"),
    (dict(kv_cache_memory=0), ValueError, "kv_cache_memory must be a positive int"),
    (dict(max_model_len=-5), ValueError, "max_model_len must be a positive int"),
    (dict(seed="x"), TypeError, "seed must be an int or None"),
])
def test_bad_engine_args(kwargs, error, words):
    from atom_frontends.native import EngineArgs

    with pytest.raises(error, match=words):
        EngineArgs(model="unused", **kwargs)


def test_engine_keeps_serving_after_bad_request(llm_and_path):
    llm, path = llm_and_path
    engine = llm.engine
    good = random_prompts([10, 20], seed=11)
    ids = [engine.add_request(p, GREEDY) for p in good]
    engine.step()  # requests are running
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([], GREEDY)
    with pytest.raises(ValueError, match="leaves no room"):
        engine.add_request(list(range(3, 67)), GREEDY)
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o.outputs[0].token_ids for o in engine.step()})
    assert [done[i] for i in ids] == hf_greedy(path, good, 8)


def test_unknown_architecture(checkpoint_factory, tmp_path):
    import json
    import shutil

    src = checkpoint_factory("LlamaForCausalLM")
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = ["MistralForCausalLM"]
    cfg["model_type"] = "mistral"
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="MistralForCausalLM.*supported: .*LlamaForCausalLM.*Qwen3ForCausalLM"):
        LLM(dst)


def test_unsupported_quantized_checkpoint(checkpoint_factory, tmp_path):
    """A quantization atom-core does not run (FP8 does: test_fp8_parity.py): refused by name, not as unexpected
    weights."""
    import json
    import shutil

    src = checkpoint_factory("DeepseekV3ForCausalLM")
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128}
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"quant_method 'awq' is not supported by atom-core \(supported: fp8"):
        LLM(dst)


def test_missing_weights(checkpoint_factory, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    src = checkpoint_factory("LlamaForCausalLM")
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks weights for: model\.layers\.1\.mlp\.down_proj\.weight"):
        LLM(dst)


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(tmp_path / "nope")


def test_kv_cache_smaller_than_max_model_len(checkpoint_factory):
    with pytest.raises(ValueError, match="fewer than max_model_len"):
        LLM(checkpoint_factory("Qwen3ForCausalLM"), num_kv_blocks=2, block_size=4, max_model_len=64)


def test_string_prompt_without_tokenizer(checkpoint_factory):
    llm = LLM(checkpoint_factory("Qwen3ForCausalLM", tokenizer=False))
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate(["hi"], GREEDY, use_tqdm=False)
    out = llm.generate([[4, 5, 6]], GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].text == "" and len(out.outputs[0].token_ids) >= 1  # vLLM: "" without detokenizing
