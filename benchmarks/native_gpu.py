"""Native engine vs HF transformers `generate` on one GPU: Qwen3-0.6B-shaped random checkpoint, bf16.

Default: prompt 128 + 128 new tokens (greedy, EOS ignored) at batch 1 and 32. Decode tokens/s =
batch * 127 / (time for 128 tokens - time for 1 token), for both engines; the roofline is the bytes
one decode step must read (all weights once + the K/V of every context token, at the mean context
128 + 64) over the device copy bandwidth measured here. Also checks that the first 16 greedy tokens
match HF's and, where they do not, prints the fp32 logit margin of the two candidates.

--throughput: 256 requests, prompt and output lengths uniform in [100, 1024], temperature 1,
EOS ignored (the common offline workload); output tokens/s over the whole run.

    python benchmarks/native_gpu.py [--throughput] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import tempfile
import time
from pathlib import Path

import torch

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                 max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6)
PROMPT, NEW, PARITY_TOKENS = 128, 128, 16
MAX_MODEL_LEN = 2048  # covers the throughput workload; also the graphs' static max_seq_len hint
DEVICE = "cuda"


def checkpoint(path: str | None) -> str:
    """Build (once) the random-weight checkpoint; reused from the temp dir by later runs."""
    from atom_frontends.native.demo import build_checkpoint

    p = Path(path or Path(tempfile.gettempdir()) / "atom-core-qwen3-0.6b-random")
    if not (p / "config.json").is_file():
        t = time.perf_counter()
        build_checkpoint(p, "Qwen3ForCausalLM", seed=0, tokenizer=False, **QWEN3_06B)
        print(f"built checkpoint {p} in {time.perf_counter() - t:.0f} s")
    return str(p)


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write), 1 GiB buffers."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device=DEVICE)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _, t = timed(lambda: [dst.copy_(src) for _ in range(20)])
    return 2 * src.numel() * src.element_size() * 20 / t


def prompts_for(batch: int, seed: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, PROMPT), generator=g).tolist()


def hf_decode(model, prompts) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts, device=DEVICE)  # equal lengths: no padding

    def gen(n):
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                              min_new_tokens=n, pad_token_id=0)

    gen(4)  # warm-up
    _, t1 = timed(lambda: gen(1))
    out, tn = timed(lambda: gen(NEW))
    return len(prompts) * (NEW - 1) / (tn - t1), out[:, PROMPT:].tolist()


def native_decode(llm, prompts) -> tuple[float, list[list[int]]]:
    from atom_frontends.native import SamplingParams

    def gen(n, ps=prompts):
        return llm.generate(ps, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)

    gen(4, [p[::-1] for p in prompts])  # warm-up: JIT-compiles the prefill kernels
    _, t1 = timed(lambda: gen(1))
    outs, tn = timed(lambda: gen(NEW))
    return len(prompts) * (NEW - 1) / (tn - t1), [o.token_ids for o in outs]


@torch.inference_mode()
def margins(model32, prompts, ref, got) -> list[str]:
    """For each prompt whose first PARITY_TOKENS differ: the fp32 logits gap of the two candidates."""
    lines = []
    for i, (p, r, g) in enumerate(zip(prompts, ref, got)):
        r, g = r[:PARITY_TOKENS], g[:PARITY_TOKENS]
        if r == g:
            continue
        k = next(j for j, (a, b) in enumerate(zip(r, g)) if a != b)
        logits = model32(torch.tensor([p + r[:k]], device=DEVICE)).logits[0, -1].float()
        top2 = logits.topk(2).values
        lines.append(f"  prompt {i}: diverges at token {k} (HF {r[k]}, ours {g[k]}): fp32 logit margin "
                     f"{(logits[r[k]] - logits[g[k]]).abs().item():.4f} (fp32 top-2 gap "
                     f"{(top2[0] - top2[1]).item():.4f}, logit std {logits.std().item():.3f})")
    return lines


def latency(path: str) -> None:
    from transformers import AutoModelForCausalLM

    from atom_frontends.native import LLM

    bw = copy_bandwidth()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, local_files_only=True).to(DEVICE).eval()
    cfg = hf.config
    weight_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())  # tied: counted once
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    llm = LLM(path, dtype="bfloat16", max_model_len=MAX_MODEL_LEN, max_num_seqs=32, kv_cache_memory=8 << 30,
              enable_prefix_caching=False)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; weights {weight_bytes / 1e9:.3f} GB; "
          f"KV {kv_per_token} B/token; CUDA graphs {'on' if llm.engine.runner.graphs else 'off'}")
    rows, parity = [], []
    for batch in (1, 32):
        prompts = prompts_for(batch, seed=batch, vocab=cfg.vocab_size)
        hf_tps, hf_tok = hf_decode(hf, prompts)
        ours_tps, ours_tok = native_decode(llm, prompts)
        step_bytes = weight_bytes + batch * (PROMPT + NEW / 2) * kv_per_token
        roof = batch * bw / step_bytes
        rows.append((batch, hf_tps, ours_tps, roof))
        parity.append((batch, prompts, hf_tok, ours_tok))
    hf.float()  # the fp32 oracle for margins
    for batch, prompts, ref, got in parity:
        same = sum(r[:PARITY_TOKENS] == g[:PARITY_TOKENS] for r, g in zip(ref, got))
        print(f"bf16 parity, batch {batch}: first {PARITY_TOKENS} greedy tokens match HF for {same}/{batch} prompts")
        for line in margins(hf, prompts, ref, got):
            print(line)
    print(f"\n{'batch':>5} {'HF tok/s':>10} {'native tok/s':>13} {'roofline tok/s':>15} "
          f"{'of roofline':>12} {'native/HF':>10}")
    for batch, hf_tps, ours_tps, roof in rows:
        print(f"{batch:>5} {hf_tps:>10.1f} {ours_tps:>13.1f} {roof:>15.0f} {ours_tps / roof:>12.1%} "
              f"{ours_tps / hf_tps:>10.1f}")


def throughput(path: str) -> None:
    from atom_frontends.native import LLM, SamplingParams

    rng = random.Random(0)
    lens = [(rng.randint(100, 1024), rng.randint(100, 1024)) for _ in range(256)]
    vocab = QWEN3_06B["vocab_size"]
    prompts = [[rng.randrange(3, vocab) for _ in range(p)] for p, _ in lens]
    params = [SamplingParams(temperature=1.0, top_p=1.0, max_tokens=o, ignore_eos=True) for _, o in lens]
    llm = LLM(path, dtype="bfloat16", max_model_len=MAX_MODEL_LEN, max_num_seqs=256,
              max_num_batched_tokens=8192)
    warm = [p[::-1] for p in prompts[:8]]  # not the timed prompts: no prefix-cache hits from the warm-up
    llm.generate(warm, SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    outs, t = timed(lambda: llm.generate(prompts, params, use_tqdm=False))
    n_out = sum(len(o.token_ids) for o in outs)
    assert n_out == sum(o for _, o in lens)
    n_in = sum(p for p, _ in lens)
    print(f"256 requests, {n_in} prompt + {n_out} output tokens in {t:.2f} s; "
          f"preemptions {llm.engine.scheduler.num_preemptions}; "
          f"CUDA graphs {'on' if llm.engine.runner.graphs else 'off'}")
    print(f"\n{'metric':<22} {'native':>10} {'goal':>8} {'native/goal':>12}")
    print(f"{'output tok/s':<22} {n_out / t:>10.0f} {13000:>8} {n_out / t / 13000:>12.2f}")
    print(f"{'total tok/s':<22} {(n_in + n_out) / t:>10.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--throughput", action="store_true", help="the 256-request offline workload")
    ap.add_argument("--checkpoint", help="where the random checkpoint is (built there if missing)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    path = checkpoint(args.checkpoint)
    print(f"{datetime.date.today()} {torch.cuda.get_device_name()} torch {torch.__version__}; "
          f"Qwen3-0.6B-shaped random checkpoint, bf16; ATOM_FUSED_QK_NORM_ROPE="
          f"{os.environ.get('ATOM_FUSED_QK_NORM_ROPE', '0')}")
    (throughput if args.throughput else latency)(path)


if __name__ == "__main__":
    main()
