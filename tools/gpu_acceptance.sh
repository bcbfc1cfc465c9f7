#!/usr/bin/env bash
# The GPU acceptance runs on the GPU machine, from the checkout's root, each a background-safe step that writes its
# logs under LOGDIR and a table last (tools/gpu_tests.py). Device time is short: start a step with
#   setsid nohup bash tools/gpu_acceptance.sh STEP LOGDIR > LOGDIR.out 2>&1 &
# inside one call and carry the next tools (tools/gpu_sglang, ../shared/gpu_vllm) while it runs.
#   base     the machine's own torch/triton: Triton kernels on GPU 0 (five groups side by side), the native engine's
#            GPU tests on GPU 1 (alone: each engine sizes its KV cache from the free memory), then the FP8 benchmarks
#   sglang   the carried SGLang (after tools/gpu_sglang/assemble.sh): graph tests, engines with graphs, the whole
#            SGLang folder on the GPU (eager engines), then benchmarks/sglang_plugin_gpu.py; GPU 0
#   sglang-tp  SGLang TP 2 / TP 2 + EP 2 engines (both GPUs)
#   vllm     the carried vLLM (../shared/gpu_vllm): its GPU tests; GPU 0
# Multi-GPU machines: NVLink multicast stays off in every child (the variables below).
set -uo pipefail
step=$1 logdir=$2
mkdir -p "$logdir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
tests="python3 tools/gpu_tests.py --gpus 1 --timeout ${GPU_TESTS_TIMEOUT:-900}"
case $step in
base)
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  K=tests/kernels
  CUDA_VISIBLE_DEVICES=0 $tests "$logdir/kernels" \
    "mla=$K/test_triton_mla.py -m gpu" "attention=$K/test_triton_attention.py -m gpu" \
    "moe=$K/test_triton_moe.py $K/test_triton_fp8_moe.py $K/test_triton_fp8_linear_interpreter.py" \
    "linear=$K/test_triton_linear.py $K/test_triton_fused_linear.py -m gpu" \
    "other=$K/test_triton_norm_rope_act.py $K/test_triton_fused.py $K/test_triton_kv_cache.py $K/test_triton_sampling.py $K/test_pdl.py $K/test_triton_dispatch.py -m gpu" &
  CUDA_VISIBLE_DEVICES=1 $tests "$logdir/native" "native=tests/frontends/native tests/core -m gpu" &
  wait
  (cd benchmarks && CUDA_VISIBLE_DEVICES=0 timeout 300 python3 fp8_gemm.py && CUDA_VISIBLE_DEVICES=0 timeout 300 python3 moe.py --check --fp8) \
    > "$logdir/fp8_bench.log" 2>&1
  ;;
sglang)
  source /tmp/sglsite/env.sh
  python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/sglsite . 2>&1 | tail -2
  S=tests/frontends/sglang
  CUDA_VISIBLE_DEVICES=0 SGLANG_LOG_DECODE_GRAPH_KEY=1 $tests "$logdir/sglang" \
    "graphs=$S/test_graphs.py $S/test_graph_model.py -m gpu" "graph_engine=$S/test_graph_engine.py -m gpu" \
    "suite=$S -m 'not gpu'"
  CUDA_VISIBLE_DEVICES=0 timeout 600 python3 benchmarks/sglang_plugin_gpu.py > "$logdir/sglang_bench.log" 2>&1
  ;;
sglang-tp)
  source /tmp/sglsite/env.sh
  $tests "$logdir/sglang_tp" "tp=tests/frontends/sglang/test_tp_engine.py -m gpu"
  ;;
vllm)
  export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
  python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/site . 2>&1 | tail -2
  CUDA_VISIBLE_DEVICES=0 $tests "$logdir/vllm" "vllm=tests/frontends/vllm -m gpu"
  ;;
*) echo "unknown step $step (base, sglang, sglang-tp, vllm)"; exit 2 ;;
esac
