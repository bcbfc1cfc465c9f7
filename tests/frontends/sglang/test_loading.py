"""How SGLang loads us: the plugin entry point, the external model package, config translation,
and importing the frontend without SGLang installed."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.frontends.sglang.batches import sglang_runtime

REPO = Path(__file__).resolve().parents[3]
MODELS = "atom_frontends.sglang.models"


def test_frontend_imports_without_sglang():
    code = (
        "import sys\n"
        "sys.modules['sglang'] = None  # any import of sglang now fails\n"
        "import atom_frontends.sglang, atom_frontends.sglang.hooks, atom_frontends.sglang.plugin\n"
        "import atom_frontends.sglang.models.entry\n"
        "from atom_core.plugins import frontend_names\n"
        "assert 'sglang' in frontend_names(), frontend_names()\n"
        "print('imported')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-3000:]


def test_import_model_classes_strict_imports_every_module():
    from sglang.srt.models.registry import ModelRegistry, import_model_classes

    from atom_core.models import supported_architectures
    from atom_frontends.sglang.wrapper import AtomSGLangModel

    classes = import_model_classes(MODELS, strict=True)
    assert sorted(classes) == supported_architectures() == ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                                                            "LlamaForCausalLM", "Qwen3ForCausalLM",
                                                            "Qwen3MoeForCausalLM"]
    for arch, cls in classes.items():
        assert cls.__name__ == arch and issubclass(cls, AtomSGLangModel)
        assert cls.__module__.startswith(MODELS + ".")
        # SGLANG_EXTERNAL_MODEL_PACKAGE (conftest) makes SGLang's registry resolve to ours.
        assert ModelRegistry.resolve_model_cls([arch]) == (cls, arch)


def test_plugin_entry_point_registers_backend_and_cli_choice(sglang_checkpoint):
    import argparse

    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
    from sglang.srt.server_args import ServerArgs

    from atom_frontends.sglang.hooks import SGLANG

    register, dist = load_plugins_by_group(GENERAL_PLUGINS_GROUP)["atom"]  # found the way SGLang finds it
    assert dist == "atom-core"
    register()
    register()  # SGLang calls it in every process; it must be idempotent
    assert SGLANG.is_active()
    assert ATTENTION_BACKEND_CHOICES.count("atom") == 1 and callable(ATTENTION_BACKENDS["atom"])
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", str(sglang_checkpoint("qwen3")), "--attention-backend", "atom"])
    assert args.attention_backend == "atom"


def test_config_translated_from_sglang_objects(sglang_checkpoint):
    from transformers import AutoConfig

    from atom_core.plugins import current_platform, hook
    from atom_frontends.sglang.config import SGLangModelConfig

    def translate_config(host_config):  # as atom_core.loader.build_model asks it
        return hook().atom_translate_config(host_config=host_config)

    path = sglang_checkpoint("llama")
    hf_config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    hf_config.context_len = 300  # what SGLang's ModelConfig resolves and hands the model
    with sglang_runtime(path) as server_args:
        host_config = SGLangModelConfig.from_model_init(hf_config, prefix="")
        config = translate_config(host_config)
        platform = current_platform("sglang")
        with pytest.raises(ValueError, match=r"not a quantized checkpoint, but the host quantizes it \(object\)"
                                           r".*SGLANG_EXTERNAL_MODEL_PACKAGE"):
            translate_config(SGLangModelConfig(hf_config, server_args, torch.float32, quant_config=object()))
    assert host_config.server_args is server_args
    assert (config.model_path, config.dtype, config.max_model_len) == (str(path), torch.float32, 300)
    assert (config.tensor_parallel_size, config.block_size, config.kv_cache_dtype) == (1, 1, "auto")
    assert config.enforce_eager and config.architecture == "LlamaForCausalLM"
    assert (platform.device, platform.tp_rank, platform.tp_size) == (torch.device("cpu"), 0, 1)


def test_outside_an_sglang_process_the_error_says_what_to_do():
    # A fresh process: an engine started by another test may have published SGLang's config here.
    code = (
        "from atom_core.plugins import current_platform\n"
        "try:\n"
        "    current_platform('sglang')\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert "must run inside an SGLang engine process" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE=atom_frontends.sglang.models" in proc.stdout


def test_hooks_as_the_core_asks_them():
    from atom_core.layers.attention import AttentionSpec
    from atom_core.plugins import host_hooks
    from atom_frontends.sglang import hooks
    from atom_frontends.sglang.metadata import build_metadata

    spec = AttentionSpec(4, 16, 0.25, 2, "model.layers.0.self_attn.attn")
    assert hooks.atom_translate_config(host_config=object()) is None  # not SGLang's object
    assert host_hooks("sglang").atom_attention_impl(spec=spec).__name__ == "SGLangAttention"
    assert host_hooks("sglang").atom_metadata_builder(spec=spec) is build_metadata
    mla = AttentionSpec(4, 24, 0.25, 1, "model.layers.0.self_attn.attn", kv_lora_rank=16, qk_rope_head_dim=8)
    assert host_hooks("sglang").atom_attention_impl(spec=mla).__name__ == "SGLangMLAAttention"


# SGLang 0.5.23's CPU path starts tp_size > 1 only with SGLANG_NCCL_SO_PATH pointing nowhere (its TP group otherwise
# creates a PyNcclCommunicator on the CPU device: init_model_parallel_group turns pynccl on for every in-tree platform
# but NPU/XPU, and torch.cuda.device(cpu) raises "Expected a cuda device, but got: cpu"; test_dp_attention.py's
# engines do that). The layouts below are checked from real ServerArgs and SGLang's own rank derivation
# (runtime_context), for more ranks than an engine on this machine could hold.
@pytest.mark.parametrize("ep_size", [1, 2, 4])
def test_dp_attention_layout_from_real_server_args(sglang_checkpoint, ep_size):
    """--tp-size 4 with DP attention over 4 attention-DP ranks (attention-TP size 1): atom-core's tensor-parallel group
    is the rank alone, its DP rank SGLang's attention-DP rank, and the MoE group the whole TP group (moe_rank ==
    SGLang's tp_rank), with SGLang's expert layout (its moe_ep_rank / moe_tp_rank). Attention-TP size 2 and attention
    context parallelism are refused, saying what to do."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    from atom_core.plugins import current_platform
    from atom_frontends.sglang.data_parallel import data_parallel_experts
    from atom_frontends.sglang.hooks import SGLANG

    args = ServerArgs(model_path=str(sglang_checkpoint("qwen3")), device="cpu", dtype="float32",
                      attention_backend="atom", disable_cuda_graph=True, skip_tokenizer_init=True, tp_size=4,
                      ep_size=ep_size)
    for rank in range(4):
        with rc.use_context(rc.create_context(args, role="test", ranks=rc.SpawnRanks(world_rank=rank))), \
                SGLANG.scope():
            with rc.get_parallel().override(attn_dp_size=4, attn_dp_rank=rank, attn_tp_size=1, attn_tp_rank=0):
                p = current_platform("sglang")
                parallel = rc.get_parallel()
                assert (p.tp_rank, p.tp_size, p.dp_rank, p.dp_size) == (0, 1, rank, 4)
                assert (p.moe_rank, p.moe_size, p.ep_size) == (rank, 4, ep_size)
                assert p.data_parallel_experts is data_parallel_experts
                if ep_size > 1:  # SGLang's own
                    assert (parallel.moe_ep_rank, parallel.moe_tp_rank) == (p.ep_rank, p.moe_tp_rank)
                assert p.local_experts(8) == list(range(8))[p.ep_rank * 8 // ep_size:(p.ep_rank + 1) * 8 // ep_size]
            with rc.get_parallel().override(attn_dp_size=2, attn_dp_rank=rank // 2, attn_tp_size=2,
                                            attn_tp_rank=rank % 2), \
                    pytest.raises(ValueError, match="attention-TP size 2.*--dp-size to --tp-size"):
                current_platform("sglang")
            with rc.get_parallel().override(attn_dp_size=2, attn_dp_rank=rank // 2, attn_tp_size=1, attn_tp_rank=0,
                                            attn_cp_size=2, attn_cp_rank=rank % 2), \
                    pytest.raises(ValueError, match="attention context parallelism.*SGLANG_EXTERNAL_MODEL_PACKAGE"):
                current_platform("sglang")


def test_expert_parallel_layout_from_real_server_args(sglang_checkpoint):
    """--tp-size 4 --ep-size 2: SGLang's moe_ep_rank / moe_tp_rank per rank become ours, experts split as SGLang's
    FusedMoE stores them (contiguous E / ep), each expert's intermediate dim over the moe_tp_size = 2 ranks; what
    needs token dispatch (all-to-all backends) and EPLB are refused."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    from atom_core.plugins import current_platform
    from atom_frontends.sglang.config import expert_parallel_layout
    from atom_frontends.sglang.hooks import SGLANG

    args = ServerArgs(model_path=str(sglang_checkpoint("qwen3")), device="cpu", dtype="float32",
                      attention_backend="atom", disable_cuda_graph=True, skip_tokenizer_init=True, tp_size=4, ep_size=2)
    layouts = []
    for rank in range(4):
        with rc.use_context(rc.create_context(args, role="test", ranks=rc.SpawnRanks(world_rank=rank))), SGLANG.scope():
            p = current_platform("sglang")
            layouts.append((p.tp_rank, p.ep_rank, p.ep_size, p.moe_tp_rank, p.moe_tp_size, p.local_experts(8)))
            parallel = rc.get_parallel()
            assert (parallel.moe_ep_rank, parallel.moe_tp_rank) == (p.ep_rank, p.moe_tp_rank)  # SGLang's own
    low, high = [0, 1, 2, 3], [4, 5, 6, 7]
    assert layouts == [(0, 0, 2, 0, 2, low), (1, 0, 2, 1, 2, low), (2, 1, 2, 0, 2, high), (3, 1, 2, 1, 2, high)]
    with rc.use_context(rc.create_context(args, role="test", ranks=rc.SpawnRanks(world_rank=1))):
        parallel = rc.get_parallel()
        # (set on copies: ServerArgs built with them would also change SGLang's process-wide settings)
        for field, value, match in [("moe_a2a_backend", "deepep", "moe_a2a_backend='deepep'"),
                                    ("enable_eplb", True, "EPLB"), ("ep_num_redundant_experts", 2, "EPLB")]:
            changed = copy.copy(args)
            setattr(changed, field, value)
            with pytest.raises(ValueError, match=f"{match}.*without it; or unset SGLANG_EXTERNAL_MODEL_PACKAGE"):
                expert_parallel_layout(changed, parallel)
