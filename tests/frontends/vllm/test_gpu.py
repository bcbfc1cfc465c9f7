"""A real vLLM on a CUDA GPU runs atom-core's models as it runs its own: torch.compile on, CUDA graphs on
(full graphs for decode-only batches, piecewise otherwise), and float32 greedy tokens == vLLM's own model
(plugin disabled, separate process) == transformers on the GPU. Five prompts of different lengths make
vLLM pad every decode batch to a captured size (8), so padded full-graph replays are covered; Qwen3 runs
a second round through the prefix cache, Llama prefills in 32-token chunks next to other decodes. DeepSeek-V3
(MLA, real 512 + 64 latent, q-LoRA, yarn, MoE) runs through our MLA layer and Triton MLA kernels the same way:
compiled, full decode graphs, two rounds (the second through the prefix cache) == transformers."""

from __future__ import annotations

import pytest
import torch

from tests.frontends.native.hf_oracle import hf_greedy, hf_model, informative_greedy, random_prompts
from tests.frontends.vllm.conftest import CHECKPOINTS, ENGINES, NEW_TOKENS, parity_jobs, run_vllm, until_eos

pytest.importorskip("vllm", reason="needs vllm (a GPU build: ../shared/gpu_vllm/README.md)")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def gpu_runs(vllm_checkpoint, prompts, tmp_path_factory):
    """(ours, vLLM's own): both with vLLM's default compilation and CUDA graph settings."""
    ours, log = run_vllm(parity_jobs(vllm_checkpoint, prompts), tmp_path_factory.mktemp("gpu_atom"),
                         VLLM_ENABLE_V1_MULTIPROCESSING="0")
    own, _ = run_vllm(parity_jobs(vllm_checkpoint, prompts), tmp_path_factory.mktemp("gpu_own"),
                      VLLM_ENABLE_V1_MULTIPROCESSING="0", ATOM_DISABLE_VLLM_PLUGIN="1")
    return dict(zip(CHECKPOINTS, ours)), dict(zip(CHECKPOINTS, own)), log


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_compiled_with_full_decode_cuda_graphs(gpu_runs, name):
    ours, own, log = gpu_runs
    (worker,) = ours[name]["workers"]
    assert worker["model_class"] == "atom_frontends.vllm.model.AtomForCausalLM"
    assert worker["decoder_compiled"], "vLLM ran atom-core's decoder eagerly"
    assert "torch.compile is off for atom-core" not in log
    # Qwen3's q/k norm + rotary run fused into our K/V write (atom::vllm_qk_norm_rope_attention), every layer
    assert (worker["fused_qk_norm_rope_layers"] > 0) == (name == "qwen3")
    # vLLM keeps FULL_AND_PIECEWISE only when the attention builder supports full decode graphs
    assert ours[name]["cudagraph_mode"] == own[name]["cudagraph_mode"] == "FULL_AND_PIECEWISE"


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_greedy_tokens_match_vllm_own_model_and_transformers(gpu_runs, vllm_checkpoint, prompts, name):
    ours, own, _ = gpu_runs
    expected = hf_greedy(vllm_checkpoint(name), prompts, NEW_TOKENS, device="cuda")
    assert own[name]["rounds"][0]["tokens"] == expected, "vLLM's own model disagrees with transformers"
    for round_ in ours[name]["rounds"]:
        assert round_["tokens"] == expected


def _divergences(model, prompts, got, want) -> list[tuple[int, int, float]]:
    """(prompt, step, transformers' float32 logit of its token minus that of ours) where got (vLLM's, cut after
    EOS as transformers stops) != want (`model`'s greedy tokens)."""
    found = []
    for i, (g, w) in enumerate(zip(until_eos(got), want)):
        if g != w:  # they differ within the shorter: a common prefix would end in EOS in both
            step = next(k for k in range(min(len(g), len(w))) if g[k] != w[k])
            with torch.inference_mode():
                logits = model(torch.tensor([prompts[i] + w[:step]], device="cuda")).logits[0, -1].float()
            found.append((i, step, (logits[w[step]] - logits[g[step]]).item()))
    return found


def test_many_sequences_launched_longest_first_match_transformers(vllm_checkpoint, tmp_path_factory):
    """160 prompts of 2-90 tokens at once: the decode batches (160 sequences x 2 KV heads > 2 programs per SM of
    an H100) run the decode kernel longest first, its order made once a step inside vLLM's full decode graphs
    (and per step in piecewise mixed steps). float32 greedy tokens == transformers' on every prompt, but where
    transformers' logits of the two tokens are within 1e-4 (a near-tie float32 rounding may flip); vLLM's own
    model's divergences printed for comparison. Not yet seen passing: session 11's first version (ours == vLLM's
    own exactly) differed on prompt 14 at step 8, where transformers takes our token (float32 on the CPU, all 16
    tokens equal to ours; logits 3.35007 for ours vs 3.34557 for vLLM's own); its second version stopped on a
    comparison bug (transformers stops at EOS, vLLM here does not), fixed since, not rerun (device time)."""
    path = vllm_checkpoint("qwen3")
    prompts = random_prompts(torch.randint(2, 91, (160,), generator=torch.Generator().manual_seed(11)).tolist(),
                             seed=11)
    job = {"model": str(path), "prompts": prompts, "max_tokens": NEW_TOKENS,
           "engine": {**ENGINES["qwen3"], "max_num_seqs": 256}}
    (ours,), _ = run_vllm([job], tmp_path_factory.mktemp("gpu_many_atom"), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    (own,), _ = run_vllm([job], tmp_path_factory.mktemp("gpu_many_own"), VLLM_ENABLE_V1_MULTIPROCESSING="0",
                         ATOM_DISABLE_VLLM_PLUGIN="1")
    assert ours["workers"][0]["model_class"] == "atom_frontends.vllm.model.AtomForCausalLM"
    assert ours["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    model = hf_model(path, device="cuda")  # one load serves the reference tokens and both margin checks
    expected = informative_greedy(model, prompts, NEW_TOKENS, path)
    assert len(set(map(tuple, expected))) > 100, "degenerate reference: most prompts give the same tokens"
    mine = _divergences(model, prompts, ours["rounds"][0]["tokens"], expected)
    theirs = _divergences(model, prompts, own["rounds"][0]["tokens"], expected)
    print(f"vs transformers: ours {mine}, vLLM's own {theirs} (prompt, step, logit margin)")
    assert all(abs(margin) < 1e-4 for _, _, margin in mine), mine


@pytest.fixture(scope="module")
def deepseek_run(checkpoint_factory, prompts, tmp_path_factory):
    path = checkpoint_factory("DeepseekV3ForCausalLM", kv_lora_rank=512, qk_rope_head_dim=64)
    job = {"model": str(path), "prompts": prompts, "max_tokens": NEW_TOKENS, "rounds": 2,
           "engine": {"enable_prefix_caching": True}}
    (result,), log = run_vllm([job], tmp_path_factory.mktemp("gpu_deepseek"), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    return path, result, log


def test_deepseek_v3_compiled_with_full_decode_graphs_matches_transformers(deepseek_run, prompts):
    path, result, log = deepseek_run
    (worker,) = result["workers"]
    assert worker["model_class"] == "atom_frontends.vllm.model.AtomForCausalLM"
    assert worker["attention_classes"] == ["atom_frontends.vllm.mla.MLAAttentionForVllm"]
    assert worker["decoder_compiled"], "vLLM ran atom-core's DeepSeek decoder eagerly"
    assert result["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    expected = hf_greedy(path, prompts, NEW_TOKENS, device="cuda")
    for round_ in result["rounds"]:
        assert until_eos(round_["tokens"]) == expected
