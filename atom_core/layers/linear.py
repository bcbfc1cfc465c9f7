"""Tensor-parallel linear layers. Each parameter carries a `weight_loader(param, loaded[, shard_id])`.

Rank and size come from the host's Platform (atom_platform hook). Shapes: weights are
[out_features_local, in_features_local] like nn.Linear. The GEMM is atom_kernels.linear on this rank's shard;
`prepare_weights()`, run once after loading (atom_core.loader.prepare_weights), lets its kernel prepack the
shard (vLLM's oneDNN GEMM on CPU); until then, and wherever the kernel is the reference, `packed` is None.

FP8 checkpoints (atom_core.layers.fp8.quantize_model calls `use_fp8`): weight float8_e4m3fn [out_local, in_local],
weight_scale [out_local, ceil(in_local / block_k)] float32 (loaded through the weight's own sharding, see
atom_core.layers.fp8), input_scale [1] for static activations; the GEMM is atom_kernels.fp8_linear. prepare_weights
sets block_n, the op's word that the scale rows are whole 128-row blocks (fp8.row_block), which lets GPUs take
cuBLAS' blockwise GEMM at large M.
"""

from __future__ import annotations

import torch
from torch import nn

import atom_kernels
from atom_core.layers import fp8
from atom_core.platform import Platform
from atom_core.plugins import current_platform
from atom_core.quantization import Fp8Scheme
from atom_kernels.reference.fp8 import fp8_dequantize


def _divide(n: int, d: int, what: str) -> int:
    if n % d:
        raise ValueError(f"{what}={n} is not divisible by tensor_parallel_size={d}")
    return n // d


def _check_shape(param: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(f"weight shape mismatch for {name}: checkpoint {tuple(loaded.shape)}, "
                         f"model expects {tuple(param.shape)}")


class LinearBase(nn.Module):
    scheme: Fp8Scheme | None = None  # set by use_fp8
    shards_input = False  # row-parallel: K is split over the ranks
    # Read as a tensor by its owner, not through forward (MLA's absorbed kv_b_proj): an fp8 weight is dequantized to
    # the model dtype once loaded.
    dequantize_after_load = False

    def __init__(self, in_local: int, out_local: int, bias: bool, platform: Platform | None) -> None:
        super().__init__()
        self.platform = platform or current_platform()
        self.tp_rank, self.tp_size = self.platform.tp_rank, self.platform.tp_size
        self.weight = nn.Parameter(torch.empty(out_local, in_local), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(out_local), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        self.packed = None  # atom_kernels.pack_linear's answer for the loaded shard (prepare_weights)

    def use_fp8(self, scheme: Fp8Scheme) -> None:
        """Hold the checkpoint's fp8 weight and scales instead of a model-dtype weight (see the module doc)."""
        out_local, in_local = self.weight.shape
        fp8.check_k_split(scheme, in_local, self.tp_size if self.shards_input else 1, type(self).__name__)
        self.scheme, self.model_dtype = scheme, self.weight.dtype
        self.block_k, self.act_group = fp8.k_block(scheme, in_local), fp8.act_group(scheme, in_local)
        self.weight = fp8.fp8_parameter(out_local, in_local)
        self.weight.weight_loader = self.weight_loader
        self.weight_scale = fp8.scale_parameter(out_local, -(-in_local // self.block_k), loader=self.scale_loader)
        self.block_n = 0  # the op's block_n: decided on the loaded scales (prepare_weights); 0 is always exact
        self.input_scale = None
        if scheme.activation == "static":  # fused shards' scales: the largest (equal when calibrated on one input)
            self.input_scale = nn.Parameter(torch.zeros(1), requires_grad=False)
            self.input_scale.weight_loader = self._input_scale_loader

    def full_rows(self, shard=None) -> int:
        """Rows of the checkpoint tensor (shard) the weight_loader takes."""
        return self.weight.shape[0]

    def scale_loader(self, param: nn.Parameter, loaded: torch.Tensor, *shard) -> None:
        cols = param.shape[1] * (self.tp_size if self.shards_input else 1)
        rows = self.full_rows(*shard)
        self.weight_loader(param, fp8.expand_scale(loaded, rows, cols, self.scheme.weight_block,
                                                   f"{type(self).__name__}{list(shard)}"), *shard)

    @staticmethod
    def _input_scale_loader(param: nn.Parameter, loaded: torch.Tensor, *shard) -> None:
        param.data = torch.maximum(param.data, loaded.float().reshape(1).to(param.device))

    def prepare_weights(self) -> None:
        if self.scheme is not None and self.dequantize_after_load:
            w = fp8_dequantize(self.weight, self.weight_scale, self.block_k).to(self.model_dtype)
            self.weight = nn.Parameter(w, requires_grad=False)
            del self.weight_scale
            self.scheme = None
        if self.scheme is None:
            self.packed = atom_kernels.pack_linear(self.weight, None if self.shards_input else self.bias)
        elif self.scheme.weight_block:  # block scales: whole 128x128 blocks in this shard's rows?
            self.block_n = fp8.row_block(self.weight_scale, self.scheme.weight_block[0])

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        _check_shape(param, loaded, type(self).__name__)
        param.data.copy_(loaded)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in_local] @ this rank's weight^T (+ bias): the fp8 GEMM for an fp8 checkpoint."""
        if self.scheme is None:
            return atom_kernels.linear(x, self.weight, bias, self.packed)
        return atom_kernels.fp8_linear(x, *self._fp8_args(), bias, self.block_n)

    def _fp8_args(self) -> tuple:
        """fp8_linear's weight arguments (weight, weight_scale, block_k, act_group, input_scale)."""
        return self.weight, self.weight_scale, self.block_k, self.act_group, self.input_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False, platform: Platform | None = None):
        super().__init__(input_size, output_size, bias, platform)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; `gather_output` all-gathers them after the matmul."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, gather_output: bool = False,
                 platform: Platform | None = None):
        platform = platform or current_platform()
        super().__init__(input_size, _divide(output_size, platform.tp_size, "output_size"), bias, platform)
        self.gather_output = gather_output

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        size = param.shape[0]
        loaded = loaded.narrow(0, self.tp_rank * size, size)
        super().weight_loader(param, loaded)

    def full_rows(self, shard=None) -> int:
        return self.weight.shape[0] * self.tp_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._gather(self.matmul(x, self.bias))

    def forward_normed(self, x: torch.Tensor, residual: torch.Tensor | None, norm: nn.Module):
        """(self(norm(x + residual)), x + residual), residual None: (self(norm(x)), x); norm: an RMSNorm, fused
        into this layer's GEMM where the device has a kernel for that."""
        if self.scheme is not None:
            y, residual = atom_kernels.rms_norm_fp8_linear(x, residual, norm.weight, norm.eps, *self._fp8_args(),
                                                           self.bias, self.block_n)
            return self._gather(y), residual
        y, residual = atom_kernels.rms_norm_linear(x, residual, norm.weight, norm.eps, self.weight, self.bias,
                                                   self.packed)
        return self._gather(y), residual

    def _gather(self, y: torch.Tensor) -> torch.Tensor:
        return self.platform.all_gather(y, -1) if self.gather_output and self.tp_size > 1 else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (e.g. gate_proj + up_proj); shard_id = index."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 platform: Platform | None = None):
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias, platform=platform)

    def full_rows(self, shard_id=None) -> int:
        return self.output_sizes[shard_id]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | None = None) -> None:
        if shard_id is None:
            raise ValueError("MergedColumnParallelLinear needs the shard index of the checkpoint tensor")
        local = [s // self.tp_size for s in self.output_sizes]
        offset = sum(local[:shard_id])
        target = param.data.narrow(0, offset, local[shard_id])
        loaded = loaded.narrow(0, self.tp_rank * local[shard_id], local[shard_id])
        _check_shape(target, loaded, f"{type(self).__name__}[{shard_id}]")
        target.copy_(loaded)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k, v projections in one matmul. Query heads are split across ranks; KV heads too, or
    replicated when there are fewer KV heads than ranks. shard_id is "q", "k" or "v"."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, platform: Platform | None = None):
        platform = platform or current_platform()
        tp = platform.tp_size
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, tp, "num_attention_heads")
        if num_kv_heads >= tp:
            self.num_kv_heads, self.kv_replicas = _divide(num_kv_heads, tp, "num_key_value_heads"), 1
        else:
            self.num_kv_heads, self.kv_replicas = 1, _divide(tp, num_kv_heads, "tensor_parallel_size")
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden_size, out, bias, platform=platform)

    @property
    def sizes(self) -> tuple[int, int, int]:
        """Local (q, k, v) widths of this rank's output."""
        return self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim

    def full_rows(self, shard_id=None) -> int:
        heads = self.num_heads if shard_id == "q" else self.num_kv_heads
        ranks = self.tp_size if shard_id == "q" else self.tp_size // self.kv_replicas
        return heads * self.head_dim * ranks

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        if shard_id not in ("q", "k", "v"):
            raise ValueError(f"QKVParallelLinear shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        q, k, _ = self.sizes
        offset, size = {"q": (0, q), "k": (q, k), "v": (q + k, k)}[shard_id]
        rank = self.tp_rank if shard_id == "q" else self.tp_rank // self.kv_replicas
        target = param.data.narrow(0, offset, size)
        loaded = loaded.narrow(0, rank * size, size)
        _check_shape(target, loaded, f"QKVParallelLinear[{shard_id}]")
        target.copy_(loaded)


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs are summed with the host's all-reduce."""

    shards_input = True

    def __init__(self, input_size: int, output_size: int, bias: bool = False, platform: Platform | None = None):
        platform = platform or current_platform()
        super().__init__(_divide(input_size, platform.tp_size, "input_size"), output_size, bias, platform)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if param.dim() == 2:
            size = param.shape[1]
            loaded = loaded.narrow(1, self.tp_rank * size, size)
        super().weight_loader(param, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(self.matmul(x, None))  # the bias is added after the all-reduce

    def forward_silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """self(silu(gate) * up) for x [..., 2 * input_size] = gate | up, the activation fused into this layer's GEMM
        where the device has a kernel for that."""
        if self.scheme is not None:
            return self._reduce(atom_kernels.silu_and_mul_fp8_linear(x, *self._fp8_args(), None, self.block_n))
        return self._reduce(atom_kernels.silu_and_mul_linear(x, self.weight, None, self.packed))

    def _reduce(self, y: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            y = self.platform.all_reduce(y)
        return y + self.bias if self.bias is not None else y
