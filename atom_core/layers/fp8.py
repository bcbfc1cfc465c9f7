"""FP8 checkpoints in the layers: which modules get fp8 weights (the checkpoint's Fp8Scheme, minus what it lists as
not converted), and a checkpoint's weight scales in the layers' one layout.

That layout (atom_kernels.reference.fp8): weight_scale [rows, ceil(K / block_k)] float32, one row per weight row.
A 128x128 block scale is repeated over its block's rows at load, so fused shards (q|k|v, gate|up) and
tensor-parallel row slices that start or end inside a block take their rows like the weight does; per-channel and
per-tensor scales are one column (block_k = K). Sharding K (row-parallel layers, the experts' down projection) cuts
the scale columns, so each rank's K must then be a multiple of the block's columns.
"""

from __future__ import annotations

import torch
from torch import nn

from atom_core.quantization import Fp8Scheme

FP8 = torch.float8_e4m3fn


def expand_scale(scale: torch.Tensor, rows: int, cols: int, block: tuple[int, int] | None, name: str) -> torch.Tensor:
    """A checkpoint's scale tensor → float32 [rows, cols] (rows: the checkpoint weight's rows; cols: its K blocks):
    block scales [ceil(rows / block rows), cols] repeated over their rows; per-channel [rows, 1] or [rows] and
    per-tensor [] or [1] repeated over the columns (and rows)."""
    s = scale.float()
    if s.numel() == 1:
        return s.reshape(1, 1).expand(rows, cols)
    s = s.unsqueeze(1) if s.dim() == 1 else s
    if s.shape[0] != rows and block is not None and s.shape[0] == -(-rows // block[0]):
        s = s.repeat_interleave(block[0], 0)[:rows]
    if s.shape[1] == 1:
        s = s.expand(s.shape[0], cols)
    if tuple(s.shape) != (rows, cols):
        raise ValueError(f"scale shape mismatch for {name}: checkpoint {tuple(scale.shape)}, expected scales for a "
                         f"[{rows}, K] weight in {cols} column block(s) of the checkpoint's quantization_config "
                         f"(weight_block_size {block}); is the quantization_config the checkpoint's own?")
    return s


def row_block(scale: torch.Tensor, block: int) -> int:
    """`block` when the scale rows [N, KB] are constant over every aligned group of `block` rows (the last group may
    be partial), so that one row per group (scale[::block]) says it all, else 0. Block scales expanded by
    expand_scale are, unless a fused shard or a tensor-parallel slice starts inside a checkpoint block (gate|up with
    a 320-row gate, a 64-row k shard), whose rows then hold two blocks' scales in one group. Compares values (one
    device sync): blocks that happen to share a scale count as one. For the op's block_n (atom_kernels.fp8_linear)."""
    if block <= 0 or scale.numel() == 0:
        return 0
    firsts = scale[::block].repeat_interleave(block, 0)[: scale.shape[0]]
    return block if torch.equal(firsts, scale) else 0


def fp8_parameter(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=FP8), requires_grad=False)


def scale_parameter(*shape: int, loader) -> nn.Parameter:
    param = nn.Parameter(torch.empty(*shape, dtype=torch.float32), requires_grad=False)
    param.weight_loader = loader
    return param


def k_block(scheme: Fp8Scheme, k: int) -> int:
    """Columns of K one scale covers: the block's, or all of `k` (per channel / per tensor)."""
    return scheme.weight_block[1] if scheme.weight_block else k


def act_group(scheme: Fp8Scheme, k: int) -> int:
    """The fp8 kernels' act_group for a GEMM over `k` columns: 0 when the activation is not quantized dynamically
    (weights only, or a static input_scale)."""
    return {"group": scheme.act_group, "token": k}.get(scheme.activation, 0)


def check_k_split(scheme: Fp8Scheme, k_local: int, tp_size: int, what: str) -> None:
    if tp_size > 1 and scheme.weight_block and k_local % scheme.weight_block[1]:
        raise ValueError(f"{what}: {k_local} input features per tensor-parallel rank is not a multiple of the FP8 "
                         f"block's {scheme.weight_block[1]} columns; use a tensor_parallel_size that divides it")


def quantize_model(model: nn.Module, scheme: Fp8Scheme | None, packed: dict[str, tuple[str, object]]) -> None:
    """Give every linear layer and MoE expert block (modules with `use_fp8`) fp8 weight parameters, except those the
    checkpoint lists as not converted; `packed`: the model's packed_modules_mapping (checkpoint name fragment → our
    fused parameter), to match fused layers by their checkpoint names."""
    if scheme is None:
        return
    for name, module in model.named_modules():
        if not hasattr(module, "use_fp8"):
            continue
        names = [name.removesuffix(ours) + fragment for fragment, (ours, _) in packed.items()
                 if name.endswith("." + ours)] or [name]
        ignored = [scheme.is_ignored([n]) for n in names]
        if any(ignored) and not all(ignored):
            raise ValueError(f"the checkpoint quantizes some of {names} but not all; atom-core runs them as one "
                             f"fused layer ({name}): all must be quantized or none")
        if not any(ignored):
            module.use_fp8(scheme)
