"""MoE routers as data: which experts each token goes to, and with what weight.

One routine covers the routers of the models we follow, each a `RouterConfig`:
- Qwen3-MoE: router GEMM in the hidden dtype, softmax in float32, top-k, optional renormalisation
  (`norm_topk_prob`), weights cast back to the hidden dtype (as transformers' Qwen3MoeTopKRouter).
- DeepSeek-V2: GEMM in float32, softmax, `greedy` or `group_limited_greedy` (groups ranked by their best
  expert), weights * `routed_scaling_factor`. Renormalised when `norm_topk_prob`, as DeepSeek's own code and
  vLLM do; transformers' V2 router never renormalises, so it is an oracle only with norm_topk_prob=False.
- DeepSeek-V3: GEMM in float32, sigmoid, `noaux_tc`: choice scores = scores + `e_score_correction_bias`,
  groups ranked by the sum of their two best choice scores, weights are the uncorrected scores of the chosen
  experts, renormalised when `norm_topk_prob`, then * `routed_scaling_factor`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

SCORINGS = ("softmax", "sigmoid")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


@dataclass(frozen=True)
class RouterConfig:
    num_experts: int
    top_k: int
    scoring: str = "softmax"
    topk_method: str = "greedy"
    renormalize: bool = False  # norm_topk_prob: chosen weights divided by their sum
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    float32_gemm: bool = False  # DeepSeek: router logits from float32 hidden and weight
    weights_in_hidden_dtype: bool = False  # Qwen3-MoE casts the routing weights to the hidden dtype
    sorted_topk: bool = True  # False: DeepSeek's unsorted top-k (same experts, another order)

    def __post_init__(self) -> None:
        if self.scoring not in SCORINGS:
            raise ValueError(f"router scoring_func={self.scoring!r} is not supported; use one of {SCORINGS}")
        if self.topk_method not in TOPK_METHODS:
            raise ValueError(f"router topk_method={self.topk_method!r} is not supported; use one of {TOPK_METHODS}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok={self.top_k} must lie in [1, num_experts={self.num_experts}]")
        if self.grouped:
            if self.n_group < 1 or self.num_experts % self.n_group:
                raise ValueError(f"n_group={self.n_group} must divide num_experts={self.num_experts}")
            if not 1 <= self.topk_group <= self.n_group:
                raise ValueError(f"topk_group={self.topk_group} must lie in [1, n_group={self.n_group}]")
            if self.top_k > self.topk_group * (self.num_experts // self.n_group):
                raise ValueError(f"num_experts_per_tok={self.top_k} exceeds the experts of topk_group="
                                 f"{self.topk_group} groups of {self.num_experts // self.n_group}")

    @property
    def grouped(self) -> bool:
        return self.topk_method != "greedy"

    @property
    def has_correction_bias(self) -> bool:
        return self.topk_method == "noaux_tc"


def _num_experts(cfg: Any) -> int:
    for name in ("num_experts", "n_routed_experts", "num_local_experts"):
        value = getattr(cfg, name, None)
        if value:
            return int(value)
    raise ValueError(f"{type(cfg).__name__} names no expert count (num_experts / n_routed_experts)")


def router_config(cfg: Any) -> RouterConfig:
    """The router of a transformers config (model_type qwen3_moe, deepseek_v2 or deepseek_v3)."""
    model_type = getattr(cfg, "model_type", None)
    if model_type not in ("qwen3_moe", "deepseek_v2", "deepseek_v3"):
        raise ValueError(f"no MoE router known for model_type={model_type!r}; known: qwen3_moe, deepseek_v2, "
                         "deepseek_v3 (or build a RouterConfig yourself)")
    common = dict(num_experts=_num_experts(cfg), top_k=int(cfg.num_experts_per_tok),
                  renormalize=bool(getattr(cfg, "norm_topk_prob", False)))
    if model_type == "qwen3_moe":
        return RouterConfig(**common, weights_in_hidden_dtype=True)
    v3 = model_type == "deepseek_v3"
    # DeepSeek-V3 configs carry no topk_method / scoring_func in transformers: V3 routes noaux_tc + sigmoid
    return RouterConfig(
        **common, float32_gemm=True, sorted_topk=False,
        scoring=getattr(cfg, "scoring_func", None) or ("sigmoid" if v3 else "softmax"),
        topk_method=getattr(cfg, "topk_method", None) or ("noaux_tc" if v3 else "greedy"),
        n_group=int(getattr(cfg, "n_group", None) or 1), topk_group=int(getattr(cfg, "topk_group", None) or 1),
        routed_scaling_factor=float(getattr(cfg, "routed_scaling_factor", 1.0)))


def route(hidden: torch.Tensor, weight: torch.Tensor, rc: RouterConfig,
          correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [T, H], router weight [E, H] → (topk_weights [T, K] float, topk_ids [T, K] int64)."""
    if rc.float32_gemm:
        logits = F.linear(hidden.float(), weight.float())
    else:
        logits = F.linear(hidden, weight)
    scores = logits.softmax(dim=-1, dtype=torch.float32) if rc.scoring == "softmax" else logits.float().sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias
    if rc.grouped:
        choice = _mask_groups(choice, rc)
    # the order of the k choices sets the row order of each expert's GEMM, and with it the last bits of the
    # output (CPU GEMMs round rows by their position): transformers' DeepSeek routers take topk unsorted
    ids = torch.topk(choice, rc.top_k, dim=-1, sorted=rc.sorted_topk)[1]
    weights = scores.gather(1, ids)
    if rc.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)  # DeepSeek's epsilon: no 0/0
    if rc.routed_scaling_factor != 1.0:
        weights = weights * rc.routed_scaling_factor
    if rc.weights_in_hidden_dtype:
        weights = weights.to(hidden.dtype)
    return weights, ids


def _mask_groups(choice: torch.Tensor, rc: RouterConfig) -> torch.Tensor:
    """Keep the experts of each token's `topk_group` best groups; the others get -inf. [T, E] → [T, E]."""
    grouped = choice.view(choice.shape[0], rc.n_group, choice.shape[1] // rc.n_group)  # [T, groups, experts per group]
    if rc.topk_method == "noaux_tc":
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(dim=-1)
    else:
        group_scores = grouped.max(dim=-1).values
    best = torch.topk(group_scores, rc.topk_group, dim=-1)[1]  # [T, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    # transformers fills V2's (softmax, > 0) scores with 0 and V3's biased ones with -inf: the same experts
    # win either way, but an unsorted top-k returns them in an order that depends on the filled values
    fill = float("-inf") if rc.topk_method == "noaux_tc" else 0.0
    return grouped.masked_fill(~keep[..., None], fill).view_as(choice)
