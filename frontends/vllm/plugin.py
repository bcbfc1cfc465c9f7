"""vLLM entry points (pyproject.toml): `vllm.general_plugins` → register(), `vllm.platform_plugins` →
platform_plugin().

vLLM runs both in every process it starts (API/engine core/workers), the platform one twice per
process: both are cheap (no model or torch work) and idempotent. Both mark the host "vllm" active for
atom_detect_host. ATOM_DISABLE_VLLM_PLUGIN=1 makes both do nothing, so vLLM runs its own models on
its own platform. vLLM's VLLM_PLUGINS filter selects entry points by name ("atom_core") as usual.
"""

from __future__ import annotations

import functools
import logging

from atom_kernels import envs

logger = logging.getLogger("vllm.atom_core")

# The vLLM model class that serves every atom-core architecture (module:Class, imported lazily by vLLM).
MODEL_TARGET = "atom_frontends.vllm.model:AtomForCausalLM"

# vLLM's built-in platform → our subclass of it (attribute of atom_frontends.vllm.platforms).
_PLATFORMS = {
    "vllm.platforms.cpu.CpuPlatform": "AtomCpuPlatform",
    "vllm.platforms.zen_cpu.ZenCpuPlatform": "AtomZenCpuPlatform",
    "vllm.platforms.cuda.CudaPlatform": "AtomCudaPlatform",
    "vllm.platforms.rocm.RocmPlatform": "AtomRocmPlatform",
}
# The built-in detectors we mirror, in vLLM's order; one answer is the platform vLLM would pick.
_BUILTINS = ("tpu", "cuda", "rocm", "xpu", "cpu")


def is_disabled() -> bool:
    return envs.ATOM_DISABLE_VLLM_PLUGIN


def register() -> None:
    """`vllm.general_plugins`: atom-core's models replace vLLM's for every architecture we support."""
    if is_disabled():
        return
    from atom_frontends.vllm.hooks import VLLM

    VLLM.activate_process()
    _register_models()
    from atom_frontends.vllm.backend import register_attention_backend

    register_attention_backend()


def _register_models() -> None:
    from vllm import ModelRegistry

    from atom_core.models import supported_architectures

    for arch in supported_architectures():
        if missing := _missing_gpu_kernels(arch):
            logger.warning("atom-core: %s stays on vLLM's own implementation on this GPU: atom-core has only the "
                           "torch reference for %s (no GPU kernel yet)", arch, ", ".join(missing))
            continue
        ModelRegistry.register_model(arch, MODEL_TARGET)


def _missing_gpu_kernels(arch: str) -> list[str]:
    """On a GPU platform, the attention ops of `arch` that would run as the torch reference (device syncs, no
    CUDA graphs: far behind vLLM's own model). Empty on CPU, where the reference is our kernel."""
    from atom_core.models import get_model_class
    from atom_kernels import dispatch

    base = _builtin_platform() or ""
    if not (".cuda." in base or ".rocm." in base):
        return []
    ops = get_model_class(arch).attention_cls.kernel_ops
    return [op for op in ops if dispatch.backend_for(op, "cuda") == "torch"]


def platform_plugin() -> str | None:
    """`vllm.platform_plugins`: the qualname of our subclass of the platform vLLM would pick, or None."""
    if is_disabled():
        return None
    base = _builtin_platform()
    ours = _PLATFORMS.get(base or "")
    if ours is None:
        logger.info("atom-core: no atom platform for vLLM platform %s; vLLM's own platform is used", base)
        return None
    from atom_frontends.vllm.hooks import VLLM

    VLLM.activate_process()
    return f"atom_frontends.vllm.platforms.{ours}"


@functools.cache
def _builtin_platform() -> str | None:
    """What vLLM's built-in detectors pick (exactly one must answer), as their plugin function says."""
    from vllm.platforms import builtin_platform_plugins

    found = []
    for name in _BUILTINS:
        try:
            qualname = builtin_platform_plugins[name]()
        except Exception:  # a detector failing means "not this platform", as in vLLM
            logger.debug("vLLM platform detector %s failed", name, exc_info=True)
            continue
        if qualname:
            found.append(qualname)
    return found[0] if len(found) == 1 else None


def atom_runs(architecture: str) -> bool:
    """True when vLLM resolves `architecture` to our model class in this process."""
    from vllm import ModelRegistry

    model = ModelRegistry.models.get(architecture)
    target = f"{getattr(model, 'module_name', '')}:{getattr(model, 'class_name', '')}"
    return target == MODEL_TARGET
