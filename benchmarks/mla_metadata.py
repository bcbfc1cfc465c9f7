"""Per-step MLA decode metadata build: persistent buffers refilled in place vs rebuilt in fresh tensors.

At decode batch 1 / 32 / 256 (block size 16, block tables as wide as the native engine makes them for
max_model_len 8192, context lengths up to 4096): the step's kv_indptr / kv_indices through
atom_kernels.reference.mla.mla_decode_metadata as the native InputBuilder runs it each step, with the
persistent buffers lent (ATOM_USE_PERSISTENT_MLA_DECODE_METADATA=1) or without (=0: new
tensors every step, as the kernels then make it). Two times per step: CPU (wall clock of 2000 back-to-back
builds, synchronised once at the end: what a decode step's CPU pays, launches included) and GPU (CUDA events
around 200 builds). Also: the device-to-device copies the design avoids (positions are the forward context's
own tensor, kv_indptr is cumsum'd in place instead of computed then copied), timed as one copy of the
batch's positions into a persistent buffer. Ratio (rebuilt / persistent) last.

    python benchmarks/mla_metadata.py [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from common import Report

from atom_kernels.reference.mla import mla_decode_buffers, mla_decode_metadata

BATCHES = (1, 32, 256)
BLOCK, WIDTH, MAX_SEQS = 16, 512, 256  # 8192 / 16 blocks a table row
HOST_STEPS, GPU_STEPS = 2000, 200
DEVICE = "cuda"


def inputs(batch: int, g: torch.Generator):
    seq_lens = torch.randint(1, 4097, (batch,), generator=g, dtype=torch.int32)
    tables = torch.randint(0, 100_000, (batch, WIDTH), generator=g, dtype=torch.int32)
    return tables.to(DEVICE), seq_lens.to(DEVICE)


def step_fn(tables, seq_lens, buffers):
    """One step's build: a fresh memo (as each step's metadata has), the buffers lent or not."""
    def fn():
        return mla_decode_metadata(tables, seq_lens, BLOCK, {}, buffers)
    return fn


def host_us(fn) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(HOST_STEPS):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / HOST_STEPS * 1e6


def gpu_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # the host queues all builds before the GPU starts them
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(GPU_STEPS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / GPU_STEPS * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    report = Report("mla_metadata", parser)
    say = report.say
    args = parser.parse_args()
    say(report.header())
    say(f"block size {BLOCK}, table width {WIDTH}, context 1..4096; host: {HOST_STEPS} builds, GPU: {GPU_STEPS}")
    g = torch.Generator().manual_seed(0)
    buffers = mla_decode_buffers(MAX_SEQS, WIDTH, DEVICE)
    rows = []
    for batch in BATCHES:
        tables, seq_lens = inputs(batch, g)
        persistent, rebuilt = step_fn(tables, seq_lens, buffers), step_fn(tables, seq_lens, None)
        a, b = persistent(), rebuilt()
        total = int(a.kv_indptr[-1])
        assert torch.equal(a.kv_indptr, b.kv_indptr) and torch.equal(a.kv_indices[:total], b.kv_indices[:total])
        positions = torch.zeros(batch, dtype=torch.int64, device=DEVICE)
        pos_buffer = torch.empty(MAX_SEQS, dtype=torch.int64, device=DEVICE)[:batch]
        copy = gpu_us(lambda: pos_buffer.copy_(positions))  # noqa: B023 - called at once, inside this iteration
        times = {"persistent": (host_us(persistent), gpu_us(persistent)),
                 "rebuilt": (host_us(rebuilt), gpu_us(rebuilt))}
        say(f"\nbatch {batch}: {total} pages")
        for name, (h, d) in times.items():
            say(f"  {name:10s} host {h:7.1f} us/step   GPU {d:7.1f} us/step")
        say(f"  avoided d2d copy of the positions: {copy:.1f} us GPU (a launch on the CPU too)")
        rows.append((batch, times, copy))
    say("\nbatch  persistent host us  rebuilt host us  persistent GPU us  rebuilt GPU us  d2d avoided us  "
        "ratio host  ratio GPU")
    for batch, t, copy in rows:
        (ph, pd), (rh, rd) = t["persistent"], t["rebuilt"]
        say(f"{batch:5d} {ph:19.1f} {rh:16.1f} {pd:18.1f} {rd:15.1f} {copy:15.1f} {rh / ph:11.2f} {rd / pd:10.2f}")
    say("(ratio = rebuilt / persistent: > 1 means the persistent buffers are faster)")
    report.save(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
