"""LLM.chat: conversations rendered with the checkpoint's chat template, then greedy == transformers."""

from __future__ import annotations

import json
import shutil

import pytest

from atom_frontends.native import LLM, SamplingParams
from tests.frontends.native.hf_oracle import hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
CONVERSATIONS = [
    [{"role": "user", "content": "Hello, who are you?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one, é?"}],
]


@pytest.fixture(scope="module")
def llm_and_path(checkpoint_factory):
    path = checkpoint_factory("Qwen3ForCausalLM")
    return LLM(path, block_size=8), path


def _hf_ids(path, conversation, **kwargs) -> list[int]:
    """What transformers' tokenizer renders and tokenizes for the conversation (the template adds <|bos|>)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, **kwargs)
    return tok(text, add_special_tokens=False).input_ids


def test_chat_matches_transformers(llm_and_path):
    llm, path = llm_and_path
    outs = llm.chat(CONVERSATIONS, GREEDY, use_tqdm=False)
    want_ids = [_hf_ids(path, c) for c in CONVERSATIONS]
    assert [o.prompt_token_ids for o in outs] == want_ids
    assert all(ids.count(1) == 1 and ids[0] == 1 for ids in want_ids)  # one <|bos|>, from the template
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(path, want_ids, 16)
    assert outs[0].prompt.endswith("<assistant>")
    one = llm.chat(CONVERSATIONS[1], GREEDY, use_tqdm=False)  # a single conversation
    assert [o.outputs[0].token_ids for o in one] == [outs[1].outputs[0].token_ids]


def test_chat_with_a_template_of_ones_own(llm_and_path):
    llm, path = llm_and_path
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    out = llm.chat(CONVERSATIONS[0], GREEDY, use_tqdm=False, chat_template=template)[0]
    assert out.prompt == "[user] Hello, who are you?\n"
    want = _hf_ids(path, CONVERSATIONS[0], chat_template=template)
    assert out.prompt_token_ids == want and out.outputs[0].token_ids == hf_greedy(path, [want], 16)[0]


@pytest.mark.parametrize("messages, error, words", [
    ([{"content": "no role"}], TypeError, "conversation 0: a conversation must be a non-empty list"),
    ([[{"role": "user", "content": "fine"}], "not a conversation"], TypeError, "conversation 1"),
    ([{"role": "user", "content": "x" * 600}], ValueError, "conversation 0: the prompt has"),
])
def test_bad_conversations_queue_nothing(llm_and_path, messages, error, words):
    llm, _ = llm_and_path
    with pytest.raises(error, match=words):
        llm.chat(messages, GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished()


def test_chat_needs_a_template(checkpoint_factory, tmp_path):
    path = tmp_path / "no-template"
    shutil.copytree(checkpoint_factory("LlamaForCausalLM"), path)
    # transformers 5 saves the template beside the tokenizer, 4.x inside tokenizer_config.json
    (path / "chat_template.jinja").unlink(missing_ok=True)
    cfg = path / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    data.pop("chat_template", None)
    cfg.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="has no chat template: pass chat_template="):
        LLM(path).chat(CONVERSATIONS[0], GREEDY, use_tqdm=False)
