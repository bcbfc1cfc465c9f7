"""The vLLM entry points as vLLM's own loader sees them, the atom platform, the switches that turn the
plugin off, the hooks, and config translation from a real VllmConfig."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("vllm")

from vllm.plugins import DEFAULT_PLUGINS_GROUP, PLATFORM_PLUGINS_GROUP, load_plugins_by_group  # noqa: E402
from vllm.utils.import_utils import resolve_obj_by_qualname  # noqa: E402

from atom_frontends.vllm import plugin  # noqa: E402
from atom_frontends.vllm.hooks import VLLM  # noqa: E402
from tests.frontends.vllm.conftest import REPO  # noqa: E402


def test_vllm_loader_finds_both_entry_points():
    assert load_plugins_by_group(DEFAULT_PLUGINS_GROUP)["atom_core"] is plugin.register
    assert load_plugins_by_group(PLATFORM_PLUGINS_GROUP)["atom_core"] is plugin.platform_plugin


def test_vllm_plugins_filter_still_selects(monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
    assert "atom_core" not in load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    assert "atom_core" not in load_plugins_by_group(PLATFORM_PLUGINS_GROUP)
    monkeypatch.setenv("VLLM_PLUGINS", "atom_core")
    assert "atom_core" in load_plugins_by_group(PLATFORM_PLUGINS_GROUP)


def test_platform_plugin_subclasses_the_platform_vllm_picks():
    from vllm.platforms import builtin_platform_plugins

    vllms_choice = resolve_obj_by_qualname(builtin_platform_plugins["cpu"]())  # this machine: CPU
    first, second = plugin.platform_plugin(), plugin.platform_plugin()  # vLLM calls it twice
    assert first == second == "atom_frontends.vllm.platforms.AtomCpuPlatform"
    ours = resolve_obj_by_qualname(first)
    assert ours is resolve_obj_by_qualname(second)
    assert issubclass(ours, vllms_choice) and ours is not vllms_choice
    assert ours._enum == vllms_choice._enum and ours().is_cpu()
    assert VLLM.is_active()


def test_current_platform_is_ours():
    from vllm.platforms import current_platform

    assert type(current_platform).__qualname__ == "AtomCpuPlatform"
    assert type(current_platform).__module__ == "atom_frontends.vllm.platforms"


def test_general_plugin_registers_every_architecture_idempotently():
    from vllm import ModelRegistry
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from atom_core.models import supported_architectures

    plugin.register()
    plugin.register()  # vLLM runs it in every process, possibly more than once
    for arch in supported_architectures():
        model = ModelRegistry.models[arch]
        assert f"{model.module_name}:{model.class_name}" == plugin.MODEL_TARGET
        assert plugin.atom_runs(arch)
    assert AttentionBackendEnum["ATOM"].get_path() == "atom_frontends.vllm.backend.AtomAttentionBackend"
    assert AttentionBackendEnum["ATOM"].get_class().get_name() == "ATOM"
    assert VLLM.is_active()


def test_disabled_plugin_does_nothing(monkeypatch):
    from vllm import ModelRegistry

    monkeypatch.setenv("ATOM_DISABLE_VLLM_PLUGIN", "1")
    before = dict(ModelRegistry.models)
    assert plugin.platform_plugin() is None
    plugin.register()
    assert dict(ModelRegistry.models) == before
    assert not VLLM.is_active()


def test_hooks_as_the_core_asks_them():
    from atom_core.layers.attention import AttentionSpec
    from atom_core.plugins import get_plugin_manager, host_hooks
    from atom_frontends.vllm import hooks
    from atom_frontends.vllm.attention import AttentionForVllm
    from atom_frontends.vllm.metadata import build_metadata

    spec = AttentionSpec(4, 32, 0.2, 2, "model.layers.0.self_attn.attn")
    assert hooks.atom_detect_host() is None  # nothing marked the host in this test
    with VLLM.scope():
        assert hooks.atom_detect_host() == "vllm"
    assert hooks.atom_translate_config(host_config=object()) is None  # not a VllmConfig
    assert "vllm" in dict(get_plugin_manager().list_name_plugin())  # a built-in frontend
    # as the Attention factory asks them: the vLLM frontend alone
    assert host_hooks("vllm").atom_attention_impl(spec=spec) is AttentionForVllm
    assert host_hooks("vllm").atom_metadata_builder(spec=spec) is build_metadata


def test_platform_hook_outside_vllm_workers_is_a_clear_error():
    from atom_core.plugins import current_platform

    with pytest.raises(RuntimeError, match="parallel groups are not initialised"):
        current_platform(host="vllm")


def test_config_translation_from_a_real_vllm_config(vllm_checkpoint):
    from vllm.engine.arg_utils import EngineArgs

    from atom_core.plugins import hook

    def translate_config(host_config):  # as atom_core.loader.build_model asks it
        return hook().atom_translate_config(host_config=host_config)

    path = vllm_checkpoint("qwen3")
    cfg = EngineArgs(model=str(path), dtype="float32", max_model_len=200, block_size=64, max_num_seqs=5,
                     max_num_batched_tokens=96, enforce_eager=True, kv_cache_dtype="fp8").create_engine_config()
    atom = translate_config(cfg)
    assert atom.hf_config is cfg.model_config.hf_config and atom.architecture == "Qwen3ForCausalLM"
    assert atom.model_path == str(path) and atom.dtype == torch.float32
    assert (atom.max_model_len, atom.block_size, atom.kv_cache_dtype) == (200, 64, "fp8")
    assert (atom.max_num_seqs, atom.max_num_batched_tokens, atom.enforce_eager) == (5, 96, True)
    assert (atom.tensor_parallel_size, atom.pipeline_parallel_size) == (1, 1)
    cfg.cache_config.cache_dtype = "fp8_e5m2"
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8_e5m2' is not supported by atom-core"):
        translate_config(cfg)
    cfg.quant_config = object()  # what vLLM makes of --quantization on an unquantized checkpoint
    with pytest.raises(ValueError, match="not a quantized checkpoint, but the host quantizes it .object.*DISABLE_VLLM"):
        translate_config(cfg)


def test_package_imports_without_vllm():
    """vllm blocked from import: the package, hooks and entry-point module still load; hooks still work."""
    code = (
        "import sys; sys.modules['vllm'] = None\n"
        "import atom_frontends.vllm, atom_frontends.vllm.hooks as h, atom_frontends.vllm.plugin as p\n"
        "assert h.atom_detect_host() is None\n"
        "assert h.atom_translate_config(host_config=object()) is None  # vLLM's config type not imported\n"
        "assert p.is_disabled() is False\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_on_a_gpu_an_architecture_without_gpu_kernels_stays_on_vllms_own(monkeypatch, caplog):
    """DeepSeek's MLA ops have only the torch reference so far: on a GPU vLLM's own DeepSeek keeps running (ours
    would sync with the host every layer and lose CUDA graphs); on CPU ours runs."""
    from vllm import ModelRegistry

    from atom_core.layers.attention import MLA_OPS
    from atom_kernels import dispatch

    own = "vllm.model_executor.models.deepseek_v2:DeepseekV3ForCausalLM"
    saved = dict(ModelRegistry.models)
    monkeypatch.setattr(plugin, "_builtin_platform", lambda: "vllm.platforms.cuda.CudaPlatform")
    monkeypatch.setattr(dispatch, "backend_for", lambda op, device: "torch" if op in MLA_OPS else "triton")
    try:
        ModelRegistry.register_model("DeepseekV3ForCausalLM", own)
        with caplog.at_level("WARNING", logger="vllm.atom_core"):
            plugin.register()
        assert not plugin.atom_runs("DeepseekV3ForCausalLM")
        assert plugin.atom_runs("Qwen3ForCausalLM") and plugin.atom_runs("Qwen3MoeForCausalLM")
        assert "DeepseekV3ForCausalLM stays on vLLM's own implementation on this GPU" in caplog.text
        assert "write_latent_cache, mla_attention" in caplog.text
        monkeypatch.setattr(plugin, "_builtin_platform", lambda: "vllm.platforms.cpu.CpuPlatform")
        plugin.register()
        assert plugin.atom_runs("DeepseekV3ForCausalLM")
    finally:
        ModelRegistry.models.clear()
        ModelRegistry.models.update(saved)


def test_expert_parallel_layout_from_a_real_vllm_config(checkpoint_factory):
    """--enable-expert-parallel as vLLM's own FusedMoE lays experts out: ep = the MoE group (dp x tp ranks, whole
    experts per rank), the configured placement (round_robin only with expert groups, else linear); PCP > 1 and EPLB
    refused."""
    from vllm.engine.arg_utils import EngineArgs

    from atom_core.platform import Platform
    from atom_frontends.vllm.config import expert_parallel_layout

    path = checkpoint_factory("Qwen3MoeForCausalLM", head_dim=32)  # vLLM refuses EP for a model without experts
    cfg = EngineArgs(model=str(path), dtype="float32", tensor_parallel_size=2,
                     enable_expert_parallel=True, expert_placement_strategy="round_robin").create_engine_config()
    assert expert_parallel_layout(cfg, 1, 2) == dict(ep_rank=1, ep_size=2, expert_placement="linear")  # no groups
    cfg.model_config.hf_text_config.n_group = 4  # DeepSeek-style expert groups
    layout = expert_parallel_layout(cfg, 1, 2)
    assert layout == dict(ep_rank=1, ep_size=2, expert_placement="round_robin")
    assert Platform("vllm", torch.device("cpu"), 1, 2, **layout).local_experts(8) == [1, 3, 5, 7]
    # DP 2 x TP 2: the second DP rank's second TP rank is MoE rank 3 of 4
    layout = expert_parallel_layout(cfg, 3, 4)
    assert layout == dict(ep_rank=3, ep_size=4, expert_placement="round_robin")
    platform = Platform("vllm", torch.device("cpu"), 1, 2, dp_rank=1, dp_size=2, data_parallel_experts=max, **layout)
    assert platform.local_experts(8) == [3, 7] and platform.moe_tp_size == 1
    cfg.parallel_config.prefill_context_parallel_size = 2
    with pytest.raises(ValueError, match="prefill_context_parallel_size=2: .*ATOM_DISABLE_VLLM_PLUGIN=1"):
        expert_parallel_layout(cfg, 1, 2)
    cfg.parallel_config.prefill_context_parallel_size = 1
    cfg.parallel_config.enable_eplb = True
    with pytest.raises(ValueError, match="enable_eplb"):
        expert_parallel_layout(cfg, 1, 2)
    cfg.parallel_config.enable_expert_parallel = False
    assert expert_parallel_layout(cfg, 1, 2) == {} and expert_parallel_layout(None, 0, 1) == {}
