"""native_gpu.py --quant fp8: the native engine on one shape three times, same run: bf16 weights, an FP8 checkpoint of
the released block format (DeepSeek-V3's and the Qwen3-FP8 releases' quantization_config: e4m3 weights, a float32
scale per 128 x 128 block, activations quantized per token and group of 128) and one of compressed-tensors'
"FP8-Dynamic" (a scale per output channel, activations per token).

Both checkpoints are config.json alone: the engine draws random weights at load (load format "dummy"), so no FP8
file of the full shape is written, and greedy tokens are not compared (the FP8 parity is the tests' job:
tests/frontends/native/test_fp8_parity.py). Decode tokens/s at batch 1 and 32 (prompt 128, 128 new tokens, greedy,
EOS ignored) as native_gpu.py times it, the decode graph's GPU time a step, and the roofline of each: the weight
bytes one decode step reads over the device copy bandwidth. The FP8 / bf16 decode ratio is printed last (issue 37's
goal at batch 1: >= 1.5).

--prefetch-ab: each FP8 checkpoint also with the FP8 GEMV's L2 prefetch off (ATOM_PDL_PREFETCH=0, read at every launch,
so at each engine's graph capture; docs/gpu.md), in the same run; the prefetch on / off ratios are printed last.
"""

from __future__ import annotations

import os

from common import QUANT_CONFIGS, SHAPES, copy_bandwidth, random_prompts, shaped_checkpoint
from native_gpu import PROMPT, free_gpu, native_decode, native_engine, profile

BATCHES = (1, 32)


def weight_bytes(llm) -> int:
    """Bytes of the model's parameters (FP8 weights count one byte, their float32 scales four)."""
    return sum(p.numel() * p.element_size() for p in llm.engine.model.parameters())


def decode_rows(path: str, vocab: int) -> tuple[dict[int, tuple[float, float]], int]:
    """({batch: (decode tok/s, decode-graph GPU ms a step)}, weight bytes) of the native engine on `path`."""
    llm = native_engine(path, fused=True, load_format="dummy", max_num_seqs=max(BATCHES))
    rows = {}
    for b in BATCHES:
        tok_s, graph_ms, _, _ = native_decode(llm, random_prompts(b, PROMPT, vocab, seed=b))
        rows[b] = (tok_s, graph_ms)
    nbytes = weight_bytes(llm)
    del llm
    free_gpu()
    return rows, nbytes


def checkpoints(shape: str) -> dict[str, str]:
    """{"bf16": config-only checkpoint of the shape, "fp8": the same in the FP8 block format, "fp8 channel": in
    compressed-tensors' per-channel format}."""
    return {"bf16": shaped_checkpoint(None, shape, weights=False),
            **{name.replace("-", " "): shaped_checkpoint(None, shape, weights=False, quantization_config=config)
               for name, config in QUANT_CONFIGS.items()}}


def profiles(shape: str) -> None:
    """--quant fp8 --profile: native_gpu.py's profile of each checkpoint (where an FP8 step's time goes)."""
    for name, path in checkpoints(shape).items():
        profile(path, f"{shape} {name}: ", load_format="dummy")


def prefetch_off(path: str, vocab: int) -> tuple[dict[int, tuple[float, float]], int]:
    """decode_rows with the FP8 GEMV's L2 prefetch off."""
    os.environ["ATOM_PDL_PREFETCH"] = "0"
    try:
        return decode_rows(path, vocab)
    finally:
        del os.environ["ATOM_PDL_PREFETCH"]


def fp8_vs_bf16(shape: str, prefetch_ab: bool = False) -> None:
    paths = checkpoints(shape)
    bw = copy_bandwidth()
    vocab = SHAPES[shape][1]["vocab_size"]
    runs = {name: decode_rows(path, vocab) for name, path in paths.items()}
    fp8 = [name for name in paths if name != "bf16"]  # the checkpoints whose GEMV prefetches
    if prefetch_ab:
        runs |= {f"{name} no prefetch": prefetch_off(paths[name], vocab) for name in fp8}
    print(f"\n{shape}, random weights drawn at load; copy bandwidth {bw / 1e12:.2f} TB/s; weights "
          + ", ".join(f"{n} {nbytes / 1e9:.3f} GB" for n, (_, nbytes) in runs.items()))
    print(f"{'batch':>5} " + " ".join(f"{n + ' tok/s':>17} {'graph ms':>8} {'roof ms':>7}" for n in runs))
    roof = {n: nbytes / bw * 1e3 for n, (_, nbytes) in runs.items()}  # the weight bytes a step reads / copy
    for b in BATCHES:
        cells = (f"{runs[n][0][b][0]:>17.0f} {runs[n][0][b][1]:>8.3f} {roof[n]:>7.3f}" for n in runs)
        print(f"{b:>5} " + " ".join(cells))
    for n in ("fp8 channel", "fp8"):
        print(f"{n} / bf16 decode tok/s: " + ", ".join(
            f"batch {b} {runs[n][0][b][0] / runs['bf16'][0][b][0]:.2f}" for b in BATCHES) + " (goal at batch 1 >= 1.5)")
    if prefetch_ab:
        for n in fp8:
            print(f"ratio {n} prefetch on / off, decode tok/s: " + ", ".join(
                f"batch {b} {runs[n][0][b][0] / runs[n + ' no prefetch'][0][b][0]:.3f}" for b in BATCHES))


if __name__ == "__main__":
    raise SystemExit("run it as: python benchmarks/native_gpu.py --quant fp8 [--shape NAME]")
