"""The vLLM model class serving every atom-core architecture (registered by plugin.register).

vLLM's model contract: __init__(*, vllm_config, prefix), embed_input_ids, forward(input_ids,
positions, intermediate_tensors, inputs_embeds) → hidden states, compute_logits(hidden) and
load_weights(weights) → the names of every parameter loaded. The core builds the model from the
VllmConfig (atom_core.loader.build_model asks our atom_translate_config for the AtomConfig); vLLM
compiles its decoder body with its own torch.compile integration (support_torch_compile), as it does for its own models,
provided dynamo can trace atom_kernels' dispatcher (probed once per process); else it runs eagerly.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig

from atom_core.dummy_weights import init_dummy_weights
from atom_core.layers.kernel_warmup import warm_up
from atom_core.loader import build_model, prepare_weights
from atom_frontends.vllm.data_parallel import register_experts
from atom_kernels import envs

logger = logging.getLogger("vllm.atom_core")


@functools.cache
def kernels_traceable(device_type: str) -> bool:
    """Can dynamo trace atom_kernels' ops (their dispatcher included) without a graph break?

    vLLM compiles with fullgraph=True, so a dispatcher dynamo cannot trace (e.g. one that imports
    kernel modules on first use) would fail the engine at warm-up; then vLLM runs our decoder eagerly.
    """
    import atom_kernels

    def probe(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return atom_kernels.silu_and_mul(atom_kernels.rms_norm(x, w, 1e-6))

    x = torch.ones(2, 8, device=device_type)
    try:
        torch.compile(probe, fullgraph=True, backend="eager", dynamic=False)(x, torch.ones(8, device=device_type))
    except Exception as e:  # dynamo reports untraceable code with many exception types
        logger.warning("atom-core: vLLM's torch.compile is off for atom-core models because dynamo cannot "
                       "trace atom_kernels' dispatcher (%s: %s); they run eagerly",
                       type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return False
    return True


def _compile_decoder(vllm_config: VllmConfig) -> bool:
    from vllm.config import CompilationMode

    if not envs.ATOM_VLLM_COMPILE:  # debug switch: our decoder eagerly even where vLLM compiles
        return False
    if vllm_config.compilation_config.mode in (CompilationMode.NONE, CompilationMode.STOCK_TORCH_COMPILE):
        return False  # vLLM compiles nothing here (eager), or wraps the whole model itself
    return kernels_traceable(vllm_config.device_config.device_type)


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": 0, "inputs_embeds": 0},
                       enable_if=_compile_decoder)
class AtomDecoder(nn.Module):
    """The core model's decoder (embeddings → layers → final norm) as vLLM's compile unit."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.decoder(input_ids, positions, inputs_embeds)


class AtomForCausalLM(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.core, atom_config, _ = build_model(vllm_config, prefix=prefix)  # refuses pipeline parallelism
        register_experts(vllm_config, self.core, f"{prefix}atom_experts.")  # with data parallelism only
        # The same decoder module, registered second: parameter names stay "core.…" (named_parameters
        # lists a shared parameter once, under its first path), so checkpoint names map as in the core.
        self.decoder = AtomDecoder(vllm_config=vllm_config, prefix=prefix, decoder=self.core.model)
        self.config = atom_config.hf_config
        self.atom_config = atom_config
        # --load-format dummy: the seed our random weights are drawn with, once vLLM's dummy loader has filled the
        # parameters (process_weights_after_loading); None once drawn, and for every other load format
        self._dummy_seed = (vllm_config.model_config.seed or 0) if vllm_config.load_config.load_format == "dummy" \
            else None

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.core.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """input_ids/positions [T] (or inputs_embeds [T, hidden]) → hidden states [T, hidden]."""
        if intermediate_tensors is not None:
            raise ValueError("atom-core models do not support pipeline parallelism (intermediate_tensors)")
        return self.decoder(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.core.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint names are the core model's; returns our parameter names (prefixed "core.")."""
        return {f"core.{name}" for name in self.core.load_weights(weights)}

    def process_weights_after_loading(self) -> None:
        """vLLM's hook once every weight is loaded, by any loader (--load-format dummy's too): our layers ready theirs
        (prepacked CPU GEMMs, cpu_linear.py; an fp8 MLA kv_b_proj dequantized), and the MoE layers compile their
        kernels' token-count variants.

        Under --load-format dummy the weights are first drawn again by atom_core.dummy_weights, as the native engine
        draws them (the same model for the same seed): vLLM's dummy loader draws every tensor uniform in [-1e-3, 1e-3]
        with one seed, so e4m3 weights round to zero (~98% of them) and float32 scales take either sign, and the fp8
        layers compute next to nothing. Once only: a later call keeps what was loaded since."""
        if self._dummy_seed is not None:
            init_dummy_weights(self.core, self._dummy_seed)
            self._dummy_seed = None
        prepare_weights(self.core)
        c = self.atom_config  # the MoE kernels' Triton variants, now (kernel_warmup)
        warm_up(c.dtype, c.max_model_len, c.max_num_batched_tokens, model=self.core)
