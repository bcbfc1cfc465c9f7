"""atom-core's model vs SGLang's OWN model vs transformers on the GPU: float32 greedy tokens, same checkpoint, same
prompts. atom-core's model runs on our attention backend ("atom") in a real sglang.Engine in this process; SGLang's own
model in a real sglang.Engine in a process without SGLANG_EXTERNAL_MODEL_PACKAGE (own_model_tokens.py); transformers
on CPU. SGLang's CUDA graphs on for both engines (helpers.GRAPHS); prompts of several lengths in one batch, then
prompts extending cached ones (radix-cache hits, checked on both sides); Llama and DeepSeek-V2 with 16-token prefill
chunks next to running decodes. For the GPU machine with the carried SGLang (tools/gpu_sglang).

What is compared, and why it can still fail:
- atom-core == transformers, exactly (as in test_graph_engine.py): IEEE float32 on both sides (our Triton kernels
  use input_precision="ieee"), so a broken op breaks it.
- SGLang's own == transformers, exactly for the dense models (Qwen3, Llama), so == atom-core too. For the MoE models
  (Qwen3-MoE, DeepSeek-V2/V3) a sequence may instead first differ at a near tie, where transformers' float32 logits
  of the two tokens are within MOE_TIE, and is not compared after it: SGLang's MoE layer sums its experts in its own
  order (under OWN_ENV its torch reference; its Triton fused_moe, where it runs, stores a float32 model's expert
  products in fp16, its compute_type for anything but bf16). Rounding transformers' expert products so on CPU moved
  these checkpoints' logits by up to 0.004 and flipped no token, but their greedy paths pass top-2 margins of
  0.006-0.008. A divergence at any larger margin fails.
SGLang's own models do not run in float32 on CUDA as they come, so their process gets two settings (OWN_BACKEND,
OWN_ENV): SGLang's default attention backend on an H200, fa3 (flashinfer elsewhere), takes fp16/bf16 only, so its
Triton backend ("triton", CUDA graphs supported) runs instead; sgl_kernel 0.4.10's rmsnorm has no float32 kernel
(fused_add_rmsnorm has), so SGLANG_FORCE_FUSED_OP_BACKEND=torch, SGLang's own switch, runs its fused ops (RMSNorm,
RoPE, SiluAndMul, TopK, the MoE layer) on their torch references; and TRITON_F32_DEFAULT=ieee makes its Triton dots
IEEE float32 rather than TF32, as ours are. The MoE layer's torch reference (moe_forward_native) copies its
per-expert token counts to the CPU, which no CUDA graph captures ("Cannot copy between CPU and CUDA tensors during
CUDA graph capture", H100 2026-12-07), so SGLang's own MoE models run without graphs here (OWN_EAGER; atom-core's keep
theirs). SGLang's own DeepSeek reads scoring_func, n_group and topk_group from the config, as released checkpoints
carry them (test_graph_engine.py's DEEPSEEK_V2 / DEEPSEEK_V3). SGLang's own Qwen3-MoE treats every layer as sparse
(it ignores mlp_only_layers: on test_graph_engine.py's checkpoint, with one dense layer, its tokens leave
transformers'), so its checkpoint here has no dense layer. Checked on CPU with these settings (torch_native
attention, a stub for the vLLM op SGLang's rope imports there): SGLang's own Qwen3, Llama (chunked) and all-sparse
Qwen3-MoE == transformers through this file's subprocess. Its own DeepSeek-V3 runs there only with every attention
call on the absorbed MLA path (torch_native cannot take the MHA prefill it picks for fresh prompts: the MLA pool's
keys are latents), forced for the diagnosis with an import hook on its attention_backend_handler; so run, its tokens
== transformers (2026-12-07). On CUDA, under OWN_ENV, SGLang's own DeepSeek drops routed_scaling_factor: its MoE block
leaves that scale to its CUDA MoE runner (the Triton fused_moe applies it) and skips it on CUDA, but the torch MoE
reference OWN_ENV selects does not apply it. Shown on the H100 (2026-12-07): its tokens first left transformers' at
exactly the steps where transformers' own tokens move when the checkpoint's scale is set to 1.0 (on CPU), whatever the
attention path (MHA prefill or absorbed MLA) or the shared-expert fusion. So its DeepSeek-V3 case here has
routed_scaling_factor 1.0 (V2's default); test_graph_engine.py runs atom-core's model on the released 2.5.
"""

from __future__ import annotations

import pytest
import torch

from tests.frontends.native.hf_oracle import hf_greedy, hf_model
from tests.frontends.sglang.helpers import GRAPHS, NEW_TOKENS, followup_prompts
from tests.frontends.sglang.own_model_tokens import own_model_tokens
from tests.frontends.sglang.test_graph_engine import CASES as GRAPH_CASES
from tests.frontends.sglang.test_graph_engine import DEEPSEEK_V3

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

OWN_BACKEND = "triton"
OWN_ENV = {"SGLANG_FORCE_FUSED_OP_BACKEND": "torch", "TRITON_F32_DEFAULT": "ieee"}
MOE_TIE = 0.02  # ~5x the largest logit error that fp16 expert stores caused on CPU (0.004)
OWN_EAGER = dict(disable_cuda_graph=True)  # SGLang's own MoE models under OWN_ENV (module doc)
# name: ((architecture, checkpoint overrides, engine args of both engines), logit margin up to which SGLang's own
# model may leave transformers' tokens, SGLang's own engine's extra args). test_graph_engine.py's cases: run in one
# pytest session, atom-core's engine of each is started once for both files (the atom_graph_tokens fixture).
CASES = {
    "qwen3": (GRAPH_CASES["qwen3"], 0.0, {}),
    "llama-chunked": (GRAPH_CASES["llama-chunked"], 0.0, {}),
    "qwen3-moe-all-sparse": (("Qwen3MoeForCausalLM", dict(num_experts_per_tok=3, num_hidden_layers=3,
                                                          mlp_only_layers=[]), {}), MOE_TIE, OWN_EAGER),
    "deepseek-v2-chunked": (GRAPH_CASES["deepseek-v2-chunked"], MOE_TIE, OWN_EAGER),
    # routed_scaling_factor 1.0: the scale SGLang's own model drops under OWN_ENV on CUDA (module doc)
    "deepseek-v3": (("DeepseekV3ForCausalLM", DEEPSEEK_V3 | dict(routed_scaling_factor=1.0), {}), MOE_TIE, OWN_EAGER),
}


@torch.inference_mode()
def divergence(model, prompt: list[int], ref: list[int], got: list[int]) -> tuple[int, float]:
    """(first step where `got` leaves transformers' tokens `ref`, transformers' float32 logit of ref's token there
    minus got's: how near a tie it was; inf when one output is a prefix of the other, which no tie explains)."""
    k = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    if k is None:
        return min(len(ref), len(got)), float("inf")
    logits = model(torch.tensor([prompt + ref[:k]])).logits[0, -1]
    return k, (logits[ref[k]] - logits[got[k]]).item()


@pytest.mark.parametrize("name", list(CASES))
def test_atom_core_and_sglangs_own_model_match_transformers(checkpoint_factory, atom_graph_tokens, prompts, name):
    (arch, overrides, engine_args), tie, own_args = CASES[name]
    path = checkpoint_factory(arch, **overrides)
    rounds = [prompts, followup_prompts(prompts)]
    ours = atom_graph_tokens(path, rounds, **engine_args)
    own = own_model_tokens(path, rounds, dict(attention_backend=OWN_BACKEND, **GRAPHS, **engine_args) | own_args,
                           NEW_TOKENS, env=OWN_ENV)
    assert own["model_class"].startswith("sglang.srt.models."), own["model_class"]  # SGLang's, not ours
    graph = "disabled" if own_args.get("disable_cuda_graph") else "full"
    assert (own["attention_backend"], own["decode_graph"]) == (OWN_BACKEND, graph)

    everything = rounds[0] + rounds[1]
    ref = hf_greedy(path, everything, NEW_TOKENS)
    assert [o["output_ids"] for r in ours for o in r] == ref  # atom-core: exact
    # every follow-up found its whole first-round prompt in the radix cache
    for side, cached in (("atom-core", [o["meta_info"]["cached_tokens"] for o in ours[1]]),
                         ("SGLang's own", [o["cached_tokens"] for o in own["rounds"][1]])):
        assert all(c >= len(p) for c, p in zip(cached, prompts[2:4])), (side, cached)

    own_ids = [o["output_ids"] for r in own["rounds"] for o in r]
    assert len(own_ids) == len(ref)
    differ = [i for i, (r, g) in enumerate(zip(ref, own_ids)) if r != g]
    model = hf_model(path) if differ else None
    report = [(i, *divergence(model, everything[i], ref[i], own_ids[i])) for i in differ]
    print(f"{name}: SGLang's own {own['model_class']} == transformers == atom-core for "
          f"{len(ref) - len(differ)}/{len(ref)} prompts; differs (prompt, step, fp32 margin): {report}")
    assert not [r for r in report if r[2] > tie], (
        f"SGLang's own model leaves transformers' (and atom-core's) tokens beyond near ties (margin > {tie}): "
        f"{report}")
