"""The mixture-of-experts layer every MoE model uses: a router (data: `RouterConfig`), stacked expert weights
run by the `fused_moe` op, and optional shared experts (DeepSeek) added to the routed output.

Parallelism (the Platform's layout): expert parallelism splits the E experts over ep_size ranks, each holding only
its E_local experts (Platform.local_experts: the host's placement), and the moe_tp_size = moe_size // ep_size ranks
that share an expert shard its intermediate dimension (like a column- then row-parallel MLP). A rank holds
gate_up_proj [E_local, 2*I/moe_tp, H] (its gate rows, then its up rows) and down_proj [E_local, H, I/moe_tp], and
expert_map [E] int32 (global id → local index, -1 for another rank's expert). The forward maps the router's ids
through it, so the op skips pairs whose expert is elsewhere (its -1 contract), and the partial outputs are summed
over the MoE group (across data-parallel ranks by the Platform's data_parallel_experts, then with its all-reduce over
the tensor-parallel group). No EP (the default): E_local = E, the intermediate dim split over all moe_size ranks.
vLLM's EP: moe_tp_size 1; SGLang's --ep-size: tp_size // ep_size. The MoE group is the tensor-parallel group, or
with data parallelism (vLLM's, SGLang's DP attention) all dp_size x tp_size ranks, every DP rank's tokens gathered
around the experts.

Checkpoints: transformers' save_pretrained writes per-expert tensors `experts.{i}.{gate,up,down}_proj.weight`
(4.x and 5.x alike; atom_core.models.weights maps them here with shard id (i, "gate"|"up"|"down")); the fused
in-memory layout of transformers 5 (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]) loads
too, as it has our parameter names.

Experts of other ranks are skipped while loading (never held); a checkpoint expert id >= E is an error.

FP8 checkpoints (`use_fp8`): both stacks float8_e4m3fn with gate_up_proj_scale [E_local, 2I/moe_tp, ceil(H / block_k)]
and down_proj_scale [E_local, H, ceil(I/moe_tp / block_k)] (atom_core.layers.fp8's layout), loaded from the per-expert
`weight_scale(_inv)` tensors through the same sharding as the weights; the experts run atom_kernels.fp8_fused_moe.
"""

from __future__ import annotations

import torch
from torch import nn

import atom_kernels
from atom_core.layers import fp8
from atom_core.layers.linear import _divide
from atom_core.layers.moe_router import RouterConfig, route
from atom_core.platform import Platform
from atom_core.plugins import current_platform
from atom_core.quantization import Fp8Scheme


def _require_shape(loaded: torch.Tensor, expected: tuple[int, ...], name: str) -> None:
    if tuple(loaded.shape) != expected:
        raise ValueError(f"weight shape mismatch for {name}: checkpoint {tuple(loaded.shape)}, model expects "
                         f"{expected} (the whole tensor, before tensor-parallel sharding)")


class FusedExperts(nn.Module):
    """E experts' SwiGLU MLPs: hidden [T, H] + routing (topk_weights, topk_ids [T, K]) → [T, H]."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, hidden_act: str = "silu",
                 platform: Platform | None = None) -> None:
        super().__init__()
        if hidden_act not in ("silu", "swish"):
            raise ValueError(f"MoE experts: hidden_act={hidden_act!r} is not supported; supported: silu")
        self.platform = platform or current_platform()
        self.num_experts = num_experts
        self.moe_tp_rank, self.moe_tp_size = self.platform.moe_tp_rank, self.platform.moe_tp_size  # split I
        self.local_experts = self.platform.local_experts(num_experts)  # global ids, in local order
        self._local_index = [-1] * num_experts  # global id → local index, -1: another rank's expert
        for local, expert in enumerate(self.local_experts):
            self._local_index[expert] = local
        self.register_buffer("expert_map", torch.tensor(self._local_index, dtype=torch.int32), persistent=False)
        self.intermediate = _divide(intermediate_size, self.moe_tp_size, "moe_intermediate_size")  # per rank
        local, e = self.intermediate, len(self.local_experts)
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * local, hidden_size), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(e, hidden_size, local), requires_grad=False)
        for param in (self.gate_up_proj, self.down_proj):
            param.weight_loader = self.weight_loader

    scheme: Fp8Scheme | None = None  # set by use_fp8

    def use_fp8(self, scheme: Fp8Scheme) -> None:
        """Hold the checkpoint's fp8 expert weights and their scales (see the module doc)."""
        if scheme.activation == "static":
            raise ValueError("FP8 MoE experts with static activation scales (input_scale) are not supported; "
                             "supported: dynamic activations (per token or token group) or weights only")
        (e, two_i, h), i = self.gate_up_proj.shape, self.intermediate
        fp8.check_k_split(scheme, i, self.moe_tp_size, "MoE experts' down_proj")
        self.scheme = scheme
        # one scale column for per-channel weights, and one activation group per token, whichever K
        self.block_k, self.act_group = fp8.k_block(scheme, max(h, i)), fp8.act_group(scheme, max(h, i))
        self.gate_up_proj, self.down_proj = fp8.fp8_parameter(e, two_i, h), fp8.fp8_parameter(e, h, i)
        for param in (self.gate_up_proj, self.down_proj):
            param.weight_loader = self.weight_loader
        self.gate_up_proj_scale = fp8.scale_parameter(e, two_i, -(-h // self.block_k), loader=self.scale_loader)
        self.down_proj_scale = fp8.scale_parameter(e, h, -(-i // self.block_k), loader=self.scale_loader)

    def scale_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: tuple[int, str] | None = None) -> None:
        if shard is None:
            raise ValueError("FP8 MoE experts load per-expert scales (experts.{i}.{gate,up,down}_proj.weight_scale); "
                             "the checkpoint has fused expert scales")
        if shard[1] == "down":  # [H, I]: K (I) is split over the ranks
            rows, cols = param.shape[1], param.shape[2] * self.moe_tp_size
        else:
            rows, cols = param.shape[1] // 2 * self.moe_tp_size, param.shape[2]
        block = self.scheme.weight_block
        self.weight_loader(param, fp8.expand_scale(loaded, rows, cols, block, f"experts.{shard[0]}.{shard[1]}"), shard)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: tuple[int, str] | None = None) -> None:
        """shard None: a fused tensor of every expert; (expert, "gate"|"up"|"down"): one expert's [out, in] (weights
        and scales alike). Checkpoint tensors are whole (every rank's experts and parts): each rank keeps its own
        experts and narrows out its part of their intermediate dim."""
        _, rows, cols = param.shape
        rank, tp = self.moe_tp_rank, self.moe_tp_size
        down = param is self.down_proj or param is getattr(self, "down_proj_scale", None)
        half = rows // 2  # gate_up: this rank's gate rows, then its up rows
        if shard is None:
            name = "experts.down_proj" if down else "experts.gate_up_proj"
            e = self.num_experts
            _require_shape(loaded, (e, rows, cols * tp) if down else (e, rows * tp, cols), name)
            if len(self.local_experts) < e:
                loaded = loaded[self.local_experts]  # [E_local, ...]: this rank's experts
            if down:  # [E, H, I]: this rank's columns
                param.data.copy_(loaded.narrow(2, rank * cols, cols))
            else:  # [E, 2I, H]: this rank's gate rows, then its up rows
                param.data.copy_(torch.cat([loaded.narrow(1, rank * half, half),
                                            loaded.narrow(1, (tp + rank) * half, half)], dim=1))
            return
        expert, kind = shard
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"checkpoint has expert {expert}, but the layer has {self.num_experts} experts "
                             "(num_experts in config.json)")
        _require_shape(loaded, (rows, cols * tp) if down else (half * tp, cols), f"experts.{expert}.{kind}_proj")
        local = self._local_index[expert]
        if local < 0:  # another rank's expert (expert parallelism): not held here
            return
        if down:  # [H, I]: this rank's columns
            param.data[local].copy_(loaded.narrow(1, rank * cols, cols))
        else:  # [I, H]: this rank's rows, into the gate (first) or up (second) half
            offset = 0 if kind == "gate" else half
            param.data[local, offset:offset + half].copy_(loaded.narrow(0, rank * half, half))

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """hidden [T, H], topk_weights / topk_ids [T, K] (global expert ids) → [T, H], summed over the MoE group.
        With data parallelism the host runs local_forward over every DP rank's tokens and sums over the DP ranks
        (Platform.data_parallel_experts)."""
        if self.platform.dp_size > 1:
            out = self.platform.data_parallel_experts(self, hidden, topk_weights, topk_ids)
        else:
            out = self.local_forward(hidden, topk_weights, topk_ids)
        return self.platform.all_reduce(out) if self.platform.tp_size > 1 else out

    def local_forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """The experts this rank holds over these tokens: [T, H], before any sum over ranks."""
        if len(self.local_experts) < self.num_experts:
            topk_ids = self.expert_map[topk_ids]  # local ids; -1: another rank's expert, which the op skips
        if self.scheme is None:
            return atom_kernels.fused_moe(hidden, self.gate_up_proj, self.down_proj, topk_weights, topk_ids)
        return atom_kernels.fp8_fused_moe(hidden, self.gate_up_proj, self.down_proj, self.gate_up_proj_scale,
                                          self.down_proj_scale, topk_weights, topk_ids, self.block_k, self.act_group)


class Router(nn.Module):
    """weight [E, H] (replicated on every rank; float32 for DeepSeek), e_score_correction_bias [E] float32 for
    noaux_tc."""

    def __init__(self, hidden_size: int, config: RouterConfig) -> None:
        super().__init__()
        self.config = config
        # DeepSeek (float32_gemm) routes with a float32 weight whatever the model dtype, as transformers keeps it
        # (_keep_in_fp32_modules_strict): a copy in bf16 would move the logits, and with them the expert choices
        # and weights, away from those of the checkpoint's weight.
        dtype = torch.float32 if config.float32_gemm else None
        self.weight = nn.Parameter(torch.empty(config.num_experts, hidden_size, dtype=dtype), requires_grad=False)
        if config.has_correction_bias:
            # float32 whatever the model dtype, as transformers keeps it (_keep_in_fp32_modules_strict)
            self.e_score_correction_bias = nn.Parameter(torch.empty(config.num_experts, dtype=torch.float32),
                                                        requires_grad=False)
        else:
            self.register_parameter("e_score_correction_bias", None)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, H] → (topk_weights [T, K], topk_ids [T, K])."""
        return route(hidden, self.weight, self.config, self.e_score_correction_bias)


class MoE(nn.Module):
    """Router + routed experts (+ `shared_experts`, any module [T, H] → [T, H], e.g. a gated MLP).

    Parameter names follow transformers' checkpoints: gate.weight, gate.e_score_correction_bias,
    experts.gate_up_proj / experts.down_proj, shared_experts.*."""

    def __init__(self, hidden_size: int, intermediate_size: int, router: RouterConfig, hidden_act: str = "silu",
                 shared_experts: nn.Module | None = None, platform: Platform | None = None) -> None:
        super().__init__()
        self.gate = Router(hidden_size, router)
        self.experts = FusedExperts(router.num_experts, hidden_size, intermediate_size, hidden_act, platform)
        self.shared_experts = shared_experts

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] → [T, H]."""
        topk_weights, topk_ids = self.gate(hidden)
        out = self.experts(hidden, topk_weights, topk_ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden)
        return out
