"""Plugin manager, host detection and the Attention factory."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from atom_core import plugins
from atom_core.hookspecs import hookimpl
from atom_frontends.native.hooks import NATIVE


@pytest.fixture(autouse=True)
def fresh_manager(monkeypatch):
    for var in ("ATOM_HOST", "ATOM_FRONTENDS", "ATOM_DISABLE_FRONTENDS", "ATOM_TRACE_HOOKS"):
        monkeypatch.delenv(var, raising=False)
    plugins.reset_plugin_manager()
    yield
    plugins.reset_plugin_manager()


class _Claimer:
    """A second frontend, registered like any external one, that claims every process."""

    def __init__(self, host):
        self.host = host

    @hookimpl
    def atom_detect_host(self):
        return self.host


class _ThirdParty:
    @hookimpl
    def atom_detect_host(self):
        return None


def test_builtin_frontends_need_no_entry_points_and_third_party_ones_come_from_them(monkeypatch):
    from importlib.metadata import EntryPoint

    monkeypatch.setattr(plugins, "entry_points", lambda group: [])  # a source checkout never pip-installed
    assert plugins.frontend_names() == ["native", "vllm", "sglang"]
    plugins.reset_plugin_manager()
    third = EntryPoint(name="third", value=f"{__name__}:_ThirdParty", group=plugins.ENTRY_POINT_GROUP)
    clash = EntryPoint(name="native", value=f"{__name__}:_ThirdParty", group=plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "entry_points",
                        lambda group: [third, clash] if group == plugins.ENTRY_POINT_GROUP else [])
    assert sorted(plugins.frontend_names()) == ["native", "sglang", "third", "vllm"]
    assert plugins.get_plugin_manager().get_plugin("native").__name__ == "atom_frontends.native.hooks"


def test_no_host_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"no atom-core frontend claims this process.*native"):
        plugins.current_host()


def test_scope_marks_host_and_restores():
    with NATIVE.scope():
        assert plugins.current_host() == "native"
        with NATIVE.scope(active=False):
            with pytest.raises(RuntimeError):
                plugins.current_host()
        assert plugins.current_host() == "native"
    assert not NATIVE.is_active()


def test_scope_is_per_thread_context():
    import threading

    seen = []
    with NATIVE.scope():
        t = threading.Thread(target=lambda: seen.append(NATIVE.is_active()))
        t.start()
        t.join()
    assert seen == [False]  # a new thread starts with a fresh context


def test_two_claimants_is_a_clear_error():
    plugins.get_plugin_manager().register(_Claimer("other"), name="other")
    NATIVE.activate_process()
    try:
        with pytest.raises(RuntimeError, match=r"several frontends claim this process: \['native', 'other'\]"):
            plugins.current_host()
    finally:
        NATIVE.deactivate_process()


def test_explicit_scope_beats_another_hosts_process_claim():
    plugins.get_plugin_manager().register(_Claimer("other"), name="other")  # e.g. SGLang owns the process
    assert plugins.current_host() == "other"
    with NATIVE.scope():
        assert plugins.current_host() == "native"
        with NATIVE.scope(active=False):
            assert plugins.current_host() == "other"


def test_atom_host_overrides_detection(monkeypatch):
    plugins.get_plugin_manager().register(_Claimer("other"), name="other")
    monkeypatch.setenv("ATOM_HOST", "native")
    assert plugins.current_host() == "native"
    monkeypatch.setenv("ATOM_HOST", "vllm-nope")
    with pytest.raises(RuntimeError, match="ATOM_HOST='vllm-nope'"):
        plugins.current_host()


def test_disable_and_allow_lists(monkeypatch):
    monkeypatch.setenv("ATOM_DISABLE_FRONTENDS", "native")
    assert "native" not in plugins.frontend_names()
    plugins.reset_plugin_manager()
    monkeypatch.delenv("ATOM_DISABLE_FRONTENDS")
    monkeypatch.setenv("ATOM_FRONTENDS", "someone-else")
    assert plugins.frontend_names() == []
    plugins.reset_plugin_manager()
    monkeypatch.setenv("ATOM_FRONTENDS", "native")
    assert plugins.frontend_names() == ["native"]


def test_hooks_of_an_unknown_host_name_it():
    with pytest.raises(RuntimeError, match="no frontend named 'mars' is loaded"):
        plugins.current_platform("mars")


def test_host_hooks_ask_that_hosts_frontend_alone():
    """Two frontends that both answer atom_attention_impl: the core gets the answer of the host it asks."""
    def frontend(answer):
        class Frontend:
            @hookimpl
            def atom_attention_impl(self, spec):
                return answer

        return Frontend()

    pm = plugins.get_plugin_manager()
    pm.register(frontend("mars-layer"), name="mars")
    pm.register(frontend("venus-layer"), name="venus")
    try:
        assert plugins.host_hooks("mars").atom_attention_impl(spec=None) == "mars-layer"
        assert plugins.host_hooks("venus").atom_attention_impl(spec=None) == "venus-layer"
    finally:
        pm.unregister(name="mars")
        pm.unregister(name="venus")


def test_a_frontend_without_an_answer_is_a_clear_error():
    class Mute:
        @hookimpl
        def atom_platform(self):
            return None

    plugins.get_plugin_manager().register(Mute(), name="mute")
    try:
        with pytest.raises(RuntimeError, match="frontend 'mute' gave no answer to atom_platform"):
            plugins.current_platform("mute")
    finally:
        plugins.get_plugin_manager().unregister(name="mute")


def test_attention_factory_returns_the_hosts_class_with_its_metadata_builder():
    from atom_core.layers import Attention
    from atom_core.layers.attention import metadata_builder_of
    from atom_frontends.native.attention import NativeAttention, NativeMLAAttention
    from atom_frontends.native.inputs import InputBuilder

    with NATIVE.scope():
        layer = Attention(8, 16, 0.25, 2, sliding_window=0, prefix="model.layers.0.self_attn.attn")
        mla = Attention(8, 24, 0.25, 1, prefix="model.layers.1.self_attn.attn", kv_lora_rank=16, qk_rope_head_dim=8)
    assert isinstance(layer, NativeAttention) and isinstance(mla, NativeMLAAttention)
    assert layer.spec.num_kv_heads == 2 and layer.spec.sliding_window is None
    assert layer.metadata_builder is InputBuilder and metadata_builder_of([layer, mla, object()]) is InputBuilder
    with pytest.raises(RuntimeError, match="found 0"):
        metadata_builder_of([object()])
    with NATIVE.scope(), pytest.raises(ValueError, match="multiple of num_kv_heads"):
        Attention(6, 16, 0.25, 4, prefix="x")


def test_translate_config_is_answered_by_the_frontend_that_knows_the_type():
    from atom_core.loader import build_model

    with NATIVE.scope(), pytest.raises(TypeError, match="no atom-core frontend recognises a host config of type dict"):
        build_model({"model": "x"})
    hook = plugins.hook()
    assert hook.atom_translate_config(host_config={"model": "x"}) is None  # vLLM's and SGLang's answer None too


def test_trace_hooks_logs_calls():
    code = textwrap.dedent("""
        import logging, os
        logging.basicConfig(level=logging.INFO)
        os.environ["ATOM_TRACE_HOOKS"] = "1"
        os.environ["ATOM_HOST"] = "native"
        from atom_core import plugins
        plugins.current_platform()
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "hook: atom_platform" in r.stderr


def test_core_imports_without_vllm_or_sglang():
    code = textwrap.dedent("""
        import sys
        for name in ("vllm", "sglang"):
            sys.modules[name] = None  # any import of them now raises ImportError
        import atom_core, atom_kernels, atom_core.layers, atom_core.models.llama, atom_core.loader
        import atom_frontends.native
        from atom_frontends.native import LLM
        assert "vllm" not in [m for m in sys.modules if sys.modules[m] is not None]
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
