"""Random weights in place of a checkpoint's (load format "dummy", as vLLM's and SGLang's `--load-format dummy`):
models at a released shape run from their config.json alone, for benchmarks and memory checks without writing (or
reading) hundreds of GB of weights. Not for outputs anyone reads: the tokens are meaningless.

Every floating-point parameter is drawn uniform in [-1e-3, 1e-3] as vLLM's dummy loader draws them (activations stay
small: no overflow in bf16 whatever the depth); e4m3 weights are drawn over the format's range instead, or they would
round to zero, and their scales (float32 parameters of FP8 layers, named *scale*) set so the dequantized weights land
in the same [-1e-3, 1e-3]. Deterministic for a seed and device. Buffers (rope tables, expert maps) are left as built.
"""

from __future__ import annotations

import torch

LOW, HIGH = -1e-3, 1e-3
FP8_RANGE = 448.0  # float8_e4m3fn's largest finite value


def init_dummy_weights(model: torch.nn.Module, seed: int = 0) -> None:
    """Fill every parameter of `model` as the module docstring says."""
    for i, (name, param) in enumerate(model.named_parameters()):
        data = param.data
        if not data.is_floating_point():
            continue
        if data.dtype != torch.float8_e4m3fn and "scale" in name.rsplit(".", 1)[-1]:
            data.fill_(HIGH / FP8_RANGE)
            continue
        low, high = (-FP8_RANGE, FP8_RANGE) if data.dtype == torch.float8_e4m3fn else (LOW, HIGH)
        g = torch.Generator(device=data.device).manual_seed(seed + i)
        data.copy_(torch.empty(data.shape, dtype=torch.float32, device=data.device).uniform_(low, high, generator=g))
