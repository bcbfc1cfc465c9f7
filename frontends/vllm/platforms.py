"""Atom platforms: subclasses of the platform vLLM would pick (CPU, CUDA, ROCm), keeping its `_enum`.

vLLM resolves the qualname that plugin.platform_plugin() returns, e.g.
"atom_frontends.vllm.platforms.AtomCpuPlatform". Each class is built on first access (module
__getattr__), so only the base vLLM actually uses is imported: importing vllm.platforms.cuda on a
CPU-only build would fail.

What the subclass adds, in check_and_update_config:
- one log line saying whether atom-core or vLLM's own implementation runs the model's architecture;
- under piecewise compilation (VLLM_COMPILE, GPUs), our attention op joins vLLM's splitting ops so
  that it runs outside the compiled/captured pieces, like vLLM's own attention;
- for an MLA model atom-core runs, the user's chunked prefill, prefix caching and step token budget stand where
  vLLM's CPU platform turns them off for MLA (its own CPU MLA cannot take them; ours can).
"""

from __future__ import annotations

import importlib
import logging

logger = logging.getLogger("vllm.atom_core")

ATTENTION_OP = "atom::vllm_attention"
QK_NORM_ROPE_ATTENTION_OP = "atom::vllm_qk_norm_rope_attention"  # Qwen3's prologue fused in

_BASES = {
    "AtomCpuPlatform": ("vllm.platforms.cpu", "CpuPlatform"),
    "AtomZenCpuPlatform": ("vllm.platforms.zen_cpu", "ZenCpuPlatform"),
    "AtomCudaPlatform": ("vllm.platforms.cuda", "CudaPlatform"),
    "AtomRocmPlatform": ("vllm.platforms.rocm", "RocmPlatform"),
}
_logged: set[str] = set()


def log_architecture_choice(vllm_config) -> None:
    """One line per process and architecture: who runs it (atom-core, or vLLM as the fallback)."""
    from atom_core.models import supported_architectures
    from atom_frontends.vllm.plugin import atom_runs

    model_config = getattr(vllm_config, "model_config", None)
    archs = getattr(model_config, "architectures", None) or []
    if not archs or archs[0] in _logged:
        return
    arch = archs[0]
    _logged.add(arch)
    if atom_runs(arch):
        logger.info("atom-core: running %s with atom-core's model and attention", arch)
    else:
        logger.warning("atom-core: architecture %s is not supported by atom-core (supported: %s); "
                       "falling back to vLLM's own implementation", arch, ", ".join(supported_architectures()))


def _scheduling(vllm_config) -> tuple:
    sched, cache = vllm_config.scheduler_config, vllm_config.cache_config
    return sched.enable_chunked_prefill, cache.enable_prefix_caching, sched.max_num_batched_tokens


def keep_mla_scheduling(vllm_config, before: tuple) -> None:
    """Put back chunked prefill, prefix caching and max_num_batched_tokens as they were before the base platform's
    check (vLLM's CPU platform turns the first two off for every MLA model, with one log line), when atom-core runs
    the model: our MLA layer reads any chunk over any cached prefix (tests/frontends/vllm/test_mla_generation.py)."""
    from atom_frontends.vllm.plugin import atom_runs

    model_config = getattr(vllm_config, "model_config", None)
    archs = getattr(model_config, "architectures", None) or []
    if not archs or not getattr(model_config, "use_mla", False) or not atom_runs(archs[0]):
        return
    if _scheduling(vllm_config) != before:
        sched, cache = vllm_config.scheduler_config, vllm_config.cache_config
        sched.enable_chunked_prefill, cache.enable_prefix_caching, sched.max_num_batched_tokens = before
        logger.info("atom-core: %s runs atom-core's MLA, which takes chunked prefill and prefix caching: "
                    "kept as configured (chunked prefill %s, prefix caching %s)", archs[0], before[0], before[1])


def add_attention_splitting_op(vllm_config) -> None:
    """Under VLLM_COMPILE, make our attention ops graph split points like vLLM's attention ops."""
    from vllm.config import CompilationMode

    cc = vllm_config.compilation_config
    if cc.mode != CompilationMode.VLLM_COMPILE:
        return
    if cc.splitting_ops is None and not cc.pass_config.fuse_attn_quant:
        # vLLM would fill in its defaults later (set_splitting_ops_for_v1): keep them, add ours.
        cc.splitting_ops = list(cc._attention_ops) + [
            "vllm::unified_kv_cache_update", "vllm::unified_mla_kv_cache_update"]
    for op in (ATTENTION_OP, QK_NORM_ROPE_ATTENTION_OP):
        if cc.splitting_ops and op not in cc.splitting_ops:
            cc.splitting_ops.append(op)


def _make(name: str) -> type:
    module, base_name = _BASES[name]
    base = getattr(importlib.import_module(module), base_name)

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        before = _scheduling(vllm_config)
        base.check_and_update_config.__func__(cls, vllm_config)
        keep_mla_scheduling(vllm_config, before)
        log_architecture_choice(vllm_config)
        add_attention_splitting_op(vllm_config)

    cls = type(name, (base,), {
        "__module__": __name__,
        "__doc__": f"vLLM's {base_name} with atom-core's additions (see atom_frontends.vllm.platforms).",
        "check_and_update_config": check_and_update_config,
    })
    cls.__qualname__ = name
    return cls


def __getattr__(name: str) -> type:
    if name not in _BASES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = globals().get("_cls_" + name) or _make(name)
    globals()["_cls_" + name] = cls
    return cls
