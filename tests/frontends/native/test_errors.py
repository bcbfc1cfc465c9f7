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


@pytest.mark.parametrize("kwargs, words", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-3), "top_k"),
    (dict(min_tokens=9, max_tokens=4), "min_tokens"),
    (dict(stop_token_ids=[-2]), "stop_token_ids"),
])
def test_bad_sampling_params(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


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
        done.update({o.request_id: o.token_ids for o in engine.step()})
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
    with pytest.raises(ValueError, match="MistralForCausalLM.*supported: LlamaForCausalLM, Qwen3ForCausalLM"):
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
    assert out.text is None and len(out.token_ids) >= 1
