"""Runs real vLLM engines in THIS process, one job after another, and writes what they produced as JSON.

The tests start it as a subprocess (`python -m tests.frontends.vllm.vllm_runner jobs.json out.json`)
so that each configuration (plugin on, plugin off via ATOM_DISABLE_VLLM_PLUGIN=1, multiprocess mode)
gets a fresh vLLM: plugins, the platform and the model registry are process-wide state.

A job: {"model": path, "prompts": [[ids]], "max_tokens": n, "engine": {LLM kwargs}}, optionally "logprobs": k (vLLM's
SamplingParams.logprobs; -1 for the whole vocabulary, with the engine's max_logprobs=-1) and "one_by_one": true (each
prompt in a generate call of its own, not batched). A result: the greedy tokens per prompt (and with "logprobs" what
vLLM returned for each generated position, by token id), and what ran them, as seen inside vLLM's worker (model
class, attention layer classes, the atom-core host, vLLM's platform class, the KV layout's strides, the parameters'
health).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def inspect_worker(model) -> dict:
    """Runs inside vLLM's worker (its own process in multiprocess mode)."""
    from vllm.platforms import current_platform

    attention = [m for m in model.modules() if hasattr(m, "get_kv_cache_spec")]
    try:
        from atom_core.plugins import current_host

        host = current_host()
    except RuntimeError:
        host = None
    return {
        "pid": os.getpid(),
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "attention_classes": sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in attention}),
        "kv_cache_bound": all(m.kv_cache.numel() > 0 for m in attention),
        # (rank, size) a tensor-parallel linear layer got (ours: from the Platform, i.e. vLLM's groups)
        "tp": next(([m.tp_rank, m.tp_size] for m in model.modules() if hasattr(m, "tp_rank")), None),
        # per MoE layer of ours: [experts held, gate_up rows (2 * intermediate per rank), their global ids]
        "experts": [[m.gate_up_proj.shape[0], m.gate_up_proj.shape[1], m.local_experts] for m in model.modules()
                    if hasattr(m, "local_experts")],
        # (rank, size) of vLLM's data parallelism our MoE layers saw (their Platform's)
        "dp": next(([m.platform.dp_rank, m.platform.dp_size] for m in model.modules() if hasattr(m, "local_experts")),
                   None),
        "atom_host": host,
        # vLLM's torch.compile wrapper around atom-core's decoder (None: not an atom-core model)
        "decoder_compiled": (not model.decoder.do_not_compile) if hasattr(model, "core") else None,
        # our attention modules running Qwen3's q/k norm + rotary fused into the K/V write
        "fused_qk_norm_rope_layers": sum(bool(getattr(m, "fused_qk_norm_rope", False)) for m in model.modules()),
        "platform_class": f"{type(current_platform).__module__}.{type(current_platform).__qualname__}",
        # who ran our attention and linear ops ("provided": vLLM's CPU kernels, atom_frontends.vllm.cpu_kernels), and
        # why any attention layer fell back to the torch reference
        "vllm_kernels": _vllm_kernels(),
        # our layers that hold a linear weight but no packed form of it after loading (atom_kernels.pack_linear; fp8
        # layers run fp8_linear on their e4m3 weight instead, unless it is dequantized after loading: MLA's kv_b_proj)
        "unpacked_linear_layers": [name for name, m in model.named_modules()
                                   if hasattr(m, "prepare_weights") and m.packed is None
                                   and (getattr(m, "scheme", None) is None or m.dequantize_after_load)],
        "parameters": _parameter_health(model),
    }


def _parameter_health(model) -> dict:
    """Floating-point parameters holding a non-finite value or only zeros (names), and the range of the e4m3 weights
    (their smallest largest-magnitude value) and of the fp8 layers' float32 scales."""
    import torch

    non_finite, all_zero, fp8_absmax, scales = [], [], [], []
    for name, p in model.named_parameters():
        if not p.is_floating_point():
            continue
        v = p.detach().float()
        if not v.isfinite().all():
            non_finite.append(name)
        elif not v.any():
            all_zero.append(name)
        if p.dtype == torch.float8_e4m3fn:
            fp8_absmax.append(v.abs().max().item())
        elif "scale" in name.rsplit(".", 1)[-1]:
            scales += [v.min().item(), v.max().item()]
    return {"non_finite": non_finite, "all_zero": all_zero, "fp8_weights": len(fp8_absmax),
            "fp8_absmax_min": min(fp8_absmax, default=None),
            "scale_range": [min(scales), max(scales)] if scales else None}


def _vllm_kernels() -> dict:
    import atom_kernels
    from atom_frontends.vllm import cpu_kernels

    backends = atom_kernels.dispatch.describe("cpu")
    return {"backends": {op: backends[op] for op in cpu_kernels.OPS}, "fallbacks": sorted(cpu_kernels._logged)}


def run_job(job: dict) -> dict:
    from vllm import LLM, SamplingParams

    engine = dict(dtype="float32", seed=0, max_model_len=256, max_num_seqs=8) | job.get("engine", {})
    t0 = time.perf_counter()
    llm = LLM(model=job["model"], **engine)
    t1 = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True,
                            logprobs=job.get("logprobs"))
    batches = [[p] for p in job["prompts"]] if job.get("one_by_one") else [job["prompts"]]
    rounds = []
    for _ in range(job.get("rounds", 1)):  # a second round of the same prompts hits the prefix cache
        outs = [o for batch in batches
                for o in llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)]
        rounds.append({"tokens": [list(o.outputs[0].token_ids) for o in outs],
                       "num_cached_tokens": [o.num_cached_tokens or 0 for o in outs]})
        if job.get("logprobs") is not None:  # per prompt, per generated position: {token id: value}
            rounds[-1]["logprobs"] = [[{t: lp.logprob for t, lp in pos.items()} for pos in o.outputs[0].logprobs]
                                      for o in outs]
    t2 = time.perf_counter()
    # By its importable name: run with -m this module is __main__, which a worker process can't unpickle.
    from tests.frontends.vllm.vllm_runner import inspect_worker as probe

    workers = llm.apply_model(probe)
    config = llm.llm_engine.vllm_config
    cudagraph_mode = str(config.compilation_config.cudagraph_mode)
    scheduling = {"chunked_prefill": config.scheduler_config.enable_chunked_prefill,
                  "prefix_caching": config.cache_config.enable_prefix_caching,
                  "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens}
    del llm
    gc.collect()
    return {"rounds": rounds, "workers": workers, "driver_pid": os.getpid(), "cudagraph_mode": cudagraph_mode,
            "scheduling": scheduling,
            "startup_s": t1 - t0, "generate_s": t2 - t1}


def main() -> None:
    jobs_path, out_path = sys.argv[1], sys.argv[2]
    with open(jobs_path) as f:
        jobs = json.load(f)
    results = [run_job(job) for job in jobs]
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
