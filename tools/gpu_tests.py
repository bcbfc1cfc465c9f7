"""Run groups of GPU tests side by side on the GPU machine, one pytest process per group, the GPUs dealt round
robin, and print a table last (group, exit code, pytest's summary line, seconds). Triton compiles on the CPU, so
several processes keep a 16-core machine and its GPU busy where one pytest would wait on compilers.

    python3 tools/gpu_tests.py LOGDIR GROUP [GROUP ...] [--timeout S] [--gpus N]
    GROUP: name=pytest arguments, e.g. "mla=tests/kernels/test_triton_mla.py -m gpu"

Each group's output goes to LOGDIR/<name>.log; the table also goes to LOGDIR/summary.txt. Exit code 0 only when
every group passed (pytest's exit code 5, no tests collected, counts as a failure)."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


def start(name: str, args: str, gpu: int | None, logdir: Path) -> tuple[subprocess.Popen, float]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    log = open(logdir / f"{name}.log", "w")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--durations=5", *shlex.split(args)]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), time.time()


def summary_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    ends = [line for line in lines if " in " in line and ("passed" in line or "failed" in line or "error" in line
                                                          or "no tests ran" in line)]
    return (ends[-1] if ends else (lines[-1] if lines else "no output")).strip("= ")[:150]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logdir", type=Path)
    ap.add_argument("groups", nargs="+", help="name=pytest arguments")
    ap.add_argument("--timeout", type=float, default=540, help="seconds; groups still running then are killed")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to deal the groups over (default: all visible)")
    args = ap.parse_args()
    args.logdir.mkdir(parents=True, exist_ok=True)
    gpus = args.gpus
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    running = {}
    for i, group in enumerate(args.groups):
        name, _, pytest_args = group.partition("=")
        running[name] = start(name, pytest_args, i % gpus if gpus > 1 else None, args.logdir)
    deadline = time.time() + args.timeout
    results = {}
    while running:
        for name, (proc, t0) in list(running.items()):
            code = proc.poll()
            if code is None and time.time() > deadline:
                proc.kill()
                code = "timeout"
            if code is not None:
                results[name] = (code, time.time() - t0)
                del running[name]
        time.sleep(1)
    table = [f"{'group':<16}{'rc':>8}{'s':>6}  pytest"]
    for name, (code, seconds) in results.items():
        table.append(f"{name:<16}{code!s:>8}{seconds:>6.0f}  {summary_line(args.logdir / f'{name}.log')}")
    text = "\n".join(table)
    (args.logdir / "summary.txt").write_text(text + "\n")
    print(text)
    sys.exit(0 if all(code == 0 for code, _ in results.values()) else 1)


if __name__ == "__main__":
    main()
