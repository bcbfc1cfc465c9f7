"""What the benchmarks share: the GPU timing method, the results report, the device copy bandwidth, paged block
tables, the random-weight checkpoints and workloads, the workload flags and the ratio line.

Every script runs as `python benchmarks/NAME.py`, which puts benchmarks/ on sys.path, so `import common` works.

GPU timing (gpu_times): every function is first called (compiling exactly the specialisation that is timed),
then timed in `rounds` rounds that interleave all functions of a shape, so a slow spell of the machine hits
them alike. Within a round the host enqueues all reps behind a GPU sleep, so no host launch overhead is ever
inside the CUDA events; L2 is flushed before every rep by READING a large buffer (flush_l2): a flush that writes
(zero_) leaves L2 full of dirty lines whose write-back the next kernel pays (on the H100 a 38.5 us MoE layer
measured 47.7 us after a writing flush). Reported (summary): the median over all reps, and the spread of the
per-round medians (min..max), which says how far to trust a row.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import json
import random
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

FLUSH_BYTES = 256 << 20  # > 5x the H100's 50 MB L2
COPY_BYTES = 2 << 30  # each way, for copy_bandwidth
RESULTS = Path(__file__).parent / "results"

# Qwen3-shaped random checkpoints. SMALL: the CPU benchmarks' (hidden 256, 6 layers, vocab 4096, float32 there).
SMALL_QWEN3 = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=32, max_position_embeddings=1024,
                   tie_word_embeddings=False)
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                 max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6)
# Qwen3-8B: a dense model whose batch-1 decode is a weight read (16 GB of bf16 a step), unlike 0.6B's (launch-bound)
QWEN3_8B = dict(QWEN3_06B, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                tie_word_embeddings=False)
QWEN3_30B_A3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                     num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, mlp_only_layers=[],
                     decoder_sparse_step=1, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                     head_dim=128, tie_word_embeddings=False, max_position_embeddings=40960,
                     rope_theta=1000000.0, rms_norm_eps=1e-6)
QWEN3_30B_A3B_4L = dict(QWEN3_30B_A3B, num_hidden_layers=4)
# DeepSeek-V3 (671B): MLA (q-LoRA 1536, latent 512 + rope 64, 128 heads), 256 routed experts (top 8 of 4 of 8 groups,
# sigmoid + noaux_tc) + 1 shared, the first 3 layers dense, yarn rope. 61 layers: benchmarks cut it (multi_gpu.py).
DEEPSEEK_V3 = dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                   n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=3,
                   topk_method="noaux_tc", scoring_func="sigmoid", n_group=8, topk_group=4, norm_topk_prob=True,
                   routed_scaling_factor=2.5, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
                   q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                   rope_parameters={"rope_type": "yarn", "factor": 40.0, "rope_theta": 10000.0,
                                    "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0,
                                    "beta_fast": 32, "beta_slow": 1},
                   max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False)
SHAPES = {"qwen3-0.6b": ("Qwen3ForCausalLM", QWEN3_06B), "qwen3-8b": ("Qwen3ForCausalLM", QWEN3_8B),
          "qwen3-30b-a3b-4l": ("Qwen3MoeForCausalLM", QWEN3_30B_A3B_4L),
          "qwen3-30b-a3b": ("Qwen3MoeForCausalLM", QWEN3_30B_A3B),
          "deepseek-v3": ("DeepseekV3ForCausalLM", DEEPSEEK_V3)}
# The released FP8 block format's quantization_config (DeepSeek-V3, the Qwen3-FP8 releases): e4m3 weights, a float32
# scale per 128 x 128 block, activations quantized per token and group of 128.
FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
# compressed-tensors "FP8-Dynamic": e4m3 weights with a scale per output channel, activations quantized per token
FP8_CHANNEL = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
               "quantization_status": "compressed", "config_groups": {"group_0": {
                   "targets": ["Linear"],
                   "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"},
                   "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                                         "dynamic": True}}}}
QUANT_CONFIGS = {"fp8": FP8_BLOCK, "fp8-channel": FP8_CHANNEL}  # the benchmarks' --quant choices
# The offline workload (native_gpu.py --throughput, vllm_peer.py, vllm_plugin_gpu.py's offline row): 256 requests,
# prompt and output lengths uniform in [100, 1024]; MAX_MODEL_LEN covers it.
OFFLINE_REQUESTS, OFFLINE_MIN, OFFLINE_MAX = 256, 100, 1024
MAX_MODEL_LEN = 2048


# ---- results -------------------------------------------------------------------------------------------------

class Report:
    """A benchmark's output: say() prints a line and keeps it; save() writes the kept lines to the file of the
    --out argument it adds to the parser, or to benchmarks/results/<stem>-<date>-<gpu>.txt, and says where."""

    def __init__(self, stem: str, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--out", help="also write the output to this file (default: benchmarks/results/"
                            f"{stem}-<date>-<gpu>.txt)")
        self.stem, self.lines = stem, []

    def header(self) -> str:
        """The first line of a kernel benchmark's output: its name, the date, the GPU, torch's and triton's versions."""
        import triton

        return (f"{self.stem} {datetime.date.today()} {torch.cuda.get_device_name()}, torch {torch.__version__}, "
                f"triton {triton.__version__}")

    def say(self, s: str = "") -> None:
        print(s, flush=True)
        self.lines.append(s)

    def save(self, out: str | None, device: str | None = None) -> Path:
        """device names the default file (default: this process's GPU)."""
        slug = re.sub(r"[^A-Za-z0-9]+", "-", device or torch.cuda.get_device_name()).strip("-")
        path = Path(out or RESULTS / f"{self.stem}-{datetime.date.today()}-{slug}.txt")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(self.lines) + "\n")
        print(f"saved {path}")
        return path


def greedy_agreement(own: list[list[int]], ours: list[list[int]], peer: str, new_tokens: int) -> str:
    """How many greedy sequences of two plugin-benchmark sides agree, and for how long (bf16: near-ties part them)."""
    pairs = list(zip(own, ours))
    same = sum(a == b for a, b in pairs)
    agree = sorted(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in pairs)
    return (f"batch {len(pairs)} greedy (bf16) vs {peer}'s own: {same}/{len(pairs)} sequences identical; tokens "
            f"before the first difference: median {agree[len(agree) // 2]}, min {agree[0]} of {new_tokens}")


def row_lines(own: dict, ours: dict, rows: list[str], peer: str) -> list[str]:
    """A plugin benchmark's rows (vllm_plugin_gpu.py, sglang_plugin_gpu.py): each side's untimed first run, its timed
    runs, then the table of medians with the ratio atom-core / the host's own last."""
    own_label = f"{peer} own tok/s"
    width = len(own_label) + 2
    lines = ["first (untimed) run of each row, s: " + ", ".join(
        f"{row} own {own[f'{row}_first_s']:.1f} / atom-core {ours[f'{row}_first_s']:.1f}" for row in rows)]
    lines.append("timed runs, tok/s (medians below): " + "; ".join(
        f"{row} own {', '.join(f'{r:,.0f}' for r in own[row]['runs'])} / atom-core "
        f"{', '.join(f'{r:,.0f}' for r in ours[row]['runs'])}" for row in rows))
    lines.append(f"{'row':<10}{own_label:>{width}}{'atom-core tok/s':>17}{'ratio':>8}")
    for row in rows:
        lines.append(f"{row:<10}{own[row]['tok_s']:>{width},.0f}{ours[row]['tok_s']:>17,.0f}"
                     f"{ours[row]['tok_s'] / own[row]['tok_s']:>8.2f}")
    return lines


def ratio_line(label: str, ours: float, peer: float, suffix: str = "") -> str:
    """The line every benchmark ends with: `ratio LABEL: ours / peer` (2 decimals)."""
    return f"ratio {label}: {ours / peer:.2f}{suffix}"


# ---- GPU timing ----------------------------------------------------------------------------------------------

def flush_l2(buf: torch.Tensor) -> None:
    """Evict L2 by reading buf (clean lines: nothing for the timed kernel to write back)."""
    buf.sum(dtype=torch.int32)


def gpu_times(fns: dict, rounds: int, reps: int) -> tuple[dict, dict]:
    """(name → GPU milliseconds of every timed launch, name → error of the functions that raised, e.g. out of
    shared memory); the method: this module's docstring."""
    live, failed = {}, {}
    for name, fn in fns.items():
        try:
            fn()
            fn()
            torch.cuda.synchronize()
            live[name] = fn
        except Exception as e:  # noqa: BLE001 - reported by the caller
            failed[name] = type(e).__name__
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    host_s = {}  # host seconds of one rep (flush + launch): sizes the GPU sleep the reps queue up behind
    for name, fn in live.items():
        t = time.perf_counter()
        for _ in range(3):
            flush_l2(flush)
            fn()
        host_s[name] = (time.perf_counter() - t) / 3
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in live}
    names = list(live)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        for name in order:
            fn = live[name]
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(reps)]
            torch.cuda._sleep(int(sleep_rate() * (2 * reps * host_s[name] + 1e-3)))
            gate = torch.cuda.Event()
            gate.record()
            for start, end in events:
                flush_l2(flush)
                start.record()
                fn()
                end.record()
            if gate.query():  # the GPU caught up with the host: launch gaps may be inside the events
                host_s[name] *= 4
                print(f"  (host-bound round for {name}: sleeping longer from now on)", flush=True)
            torch.cuda.synchronize()
            times[name].extend(s.elapsed_time(e) for s, e in events)
    return times, failed


@functools.cache
def sleep_rate() -> float:
    """torch.cuda._sleep cycles per second on this GPU."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    a.record()
    torch.cuda._sleep(20_000_000)
    b.record()
    torch.cuda.synchronize()
    return 20_000_000 / (a.elapsed_time(b) * 1e-3)


def summary(ts: list, rounds: int) -> tuple[float, float, float]:
    """(median ms, min and max of the per-round medians)."""
    per = len(ts) // rounds
    meds = [statistics.median(ts[i * per:(i + 1) * per]) for i in range(rounds)]
    return statistics.median(ts), min(meds), max(meds)


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s, counting read + write (COPY_BYTES each way)."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times, _ = gpu_times({"copy": lambda: dst.copy_(src)}, 3, 10)
    return 2 * COPY_BYTES / (summary(times["copy"], 3)[0] * 1e-3)


# ---- workloads -----------------------------------------------------------------------------------------------

def shuffled_tables(lens: list[int], g: torch.Generator, block: int = 16) -> tuple[torch.Tensor, int]:
    """Block tables [len(lens), max blocks] (int32, on the GPU) over shuffled blocks of `block` tokens for
    sequences of the given lengths, and the number of blocks they use."""
    blocks = [-(-n // block) for n in lens]
    perm = torch.randperm(sum(blocks), device="cuda", generator=g).to(torch.int32)
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.int32, device="cuda")
    start = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = perm[start:start + n]
        start += n
    return tables, sum(blocks)


def random_prompts(batch: int, prompt_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """batch prompts of prompt_len token ids in [3, vocab) (above the special ids), seeded."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, prompt_len), generator=g).tolist()


def offline_lengths() -> tuple[random.Random, list[tuple[int, int]]]:
    """The offline workload's (prompt, output) lengths and the seeded generator to draw its prompts from next."""
    rng = random.Random(0)
    return rng, [(rng.randint(OFFLINE_MIN, OFFLINE_MAX), rng.randint(OFFLINE_MIN, OFFLINE_MAX))
                 for _ in range(OFFLINE_REQUESTS)]


def offline_prompts(vocab: int) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """The offline workload's prompts (token ids in [3, vocab)) and (prompt, output) lengths."""
    rng, lens = offline_lengths()
    return [[rng.randrange(3, vocab) for _ in range(p)] for p, _ in lens], lens


def add_batch_args(ap: argparse.ArgumentParser, batch: int = 8, prompt_len: int = 64, new_tokens: int = 64) -> None:
    """--batch, --prompt-len, --new-tokens: the batch the CPU benchmarks generate."""
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--prompt-len", type=int, default=prompt_len)
    ap.add_argument("--new-tokens", type=int, default=new_tokens)


# ---- checkpoints ---------------------------------------------------------------------------------------------

def small_checkpoint(folder: str) -> str:
    """The CPU benchmarks' random-weight SMALL_QWEN3 checkpoint, built into folder (no tokenizer)."""
    from atom_frontends.native.demo import build_checkpoint

    return str(build_checkpoint(folder, "Qwen3ForCausalLM", tokenizer=False, **SMALL_QWEN3))


def shaped_checkpoint(path: str | None, shape: str = "qwen3-0.6b", dtype: str = "float32", weights: bool = True,
                      **overrides) -> str:
    """A random-weight checkpoint of one of SHAPES (its config changed by overrides: a cut, a tiny variant), weights
    in dtype, built once (into the temp dir unless path says where) and reused by later runs. weights=False: its
    config.json alone, for the hosts' load format "dummy"."""
    from atom_frontends.native.demo import build_checkpoint

    variant = ""
    if overrides or dtype != "float32":  # its own folder: a digest of what differs from the shape
        variant = "-" + hashlib.sha1(json.dumps([dtype, overrides], sort_keys=True).encode()).hexdigest()[:10]
    variant += "" if weights else "-config"
    p = Path(path or Path(tempfile.gettempdir()) / f"atom-core-{shape}-random{variant}")
    if not (p / "config.json").is_file():
        t = time.perf_counter()
        arch, cfg = SHAPES[shape]
        # built beside it, then renamed: a build cut short (tens of GB take minutes) is never taken for a checkpoint
        tmp = p.with_name(p.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        build_checkpoint(tmp, arch, seed=0, tokenizer=False, dtype=dtype, weights=weights, **{**cfg, **overrides})
        tmp.rename(p)
        print(f"built checkpoint {p} in {time.perf_counter() - t:.0f} s")
    return str(p)

