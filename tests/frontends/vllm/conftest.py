"""Fixtures for the vLLM frontend tests: tiny checkpoints vLLM's CPU attention accepts, and vLLM runs
in fresh subprocesses (tests/frontends/vllm/vllm_runner.py), one per configuration, shared per session.

vLLM's CPU attention only takes head sizes of 32 and up, so the checkpoints use head_dim 32. The init is
build_checkpoint's wide one, and the transformers oracle (hf_greedy) refuses a reference whose tokens do not vary.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fp8_checkpoints import QWEN3_MOE
from tests.frontends.native.hf_oracle import hf_greedy, random_prompts

# Each test module skips itself without vllm (pytest.importorskip); this file must import without it.

REPO = Path(__file__).resolve().parents[3]
CHECKPOINTS = {
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=False)),
    "llama": ("LlamaForCausalLM", dict(hidden_size=128)),
}
# Qwen3-MoE mixing a dense layer (mlp_only_layers) with MoE layers of top-3 of 8 experts: test_moe_generation.py, and
# the tensor- and expert-parallel workers of test_generation.py
QWEN3_MOE_CHECKPOINT = ("Qwen3MoeForCausalLM", dict(head_dim=32, num_experts_per_tok=3, num_hidden_layers=3,
                                                    mlp_only_layers=[1]))
PROMPT_LENGTHS = [3, 17, 40, 64, 9]
NEW_TOKENS = 16
# Engine settings both vLLM runs (atom-core's models and vLLM's own) share.
ENGINES = {
    # 32-token blocks (vLLM's CPU attention needs multiples of 32) so the second round of the same
    # prompts reuses cached blocks of the 40- and 64-token prompts (prefix caching)
    "qwen3": dict(enable_prefix_caching=True, block_size=32),
    # a 32-token step budget: prompts are prefilled in chunks, next to other requests' decodes
    "llama": dict(enable_prefix_caching=True, max_num_batched_tokens=32),
}


@pytest.fixture(autouse=True)
def _leave_host_unmarked():
    """Our vLLM entry points mark the host "vllm" process-wide; don't let that leak out of a test."""
    yield
    from atom_frontends.vllm.hooks import VLLM

    VLLM.deactivate_process()


@pytest.fixture
def vllm_kernels():
    """vLLM's CPU kernels registered as the dispatcher's provided backend, as the vLLM attention layer does on vLLM's
    CPU platform; removed afterwards (atom_kernels' own CPU kernels and the reference serve every op again)."""
    from atom_frontends.vllm.cpu_kernels import OPS, register_vllm_kernels
    from atom_kernels import dispatch

    register_vllm_kernels()
    assert all(dispatch.backend_for(op, "cpu") == "provided" for op in OPS)
    yield
    for op in OPS:
        dispatch.register(op, "provided", None)
    assert "provided" not in dispatch.describe("cpu").values()


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    return random_prompts(PROMPT_LENGTHS, seed=7)


@pytest.fixture(scope="session")
def vllm_checkpoint(checkpoint_factory):
    def make(name: str) -> Path:
        """name: a key of CHECKPOINTS, or "qwen3_moe" (QWEN3_MOE_CHECKPOINT)."""
        arch, overrides = QWEN3_MOE_CHECKPOINT if name == "qwen3_moe" else CHECKPOINTS[name]
        return checkpoint_factory(arch, **overrides)

    return make


@pytest.fixture(scope="session")
def hf_tokens(vllm_checkpoint, prompts):
    cache: dict[str, list[list[int]]] = {}

    def get(name: str) -> list[list[int]]:
        if name not in cache:
            cache[name] = hf_greedy(vllm_checkpoint(name), prompts, NEW_TOKENS)
        return cache[name]

    return get


def until_eos(outputs: list[list[int]], eos: int = 2) -> list[list[int]]:
    """vLLM runs with ignore_eos; transformers stops after EOS (id 2 in our checkpoints)."""
    return [o[:o.index(eos) + 1] if eos in o else o for o in outputs]


def _runner(jobs: list[dict], tmp_path: Path, env: dict[str, str]) -> tuple[list[str], dict[str, str], Path]:
    """(command, environment, results file) of a `python -m tests.frontends.vllm.vllm_runner` process."""
    jobs_file, out_file = tmp_path / "jobs.json", tmp_path / "results.json"
    jobs_file.write_text(json.dumps(jobs))
    # The repo first, then the caller's PYTHONPATH (on the GPU machine vLLM itself lives there: /tmp/site).
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "tests.frontends.vllm.vllm_runner", str(jobs_file), str(out_file)]
    return cmd, {**os.environ, "PYTHONPATH": pythonpath, **env}, out_file


def run_vllm(jobs: list[dict], tmp_path: Path, timeout: int = 900, **env: str) -> tuple[list[dict], str]:
    """Run `jobs` in a fresh `python -m tests.frontends.vllm.vllm_runner` process; (results, its log)."""
    cmd, full_env, out_file = _runner(jobs, tmp_path, env)
    proc = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"vLLM subprocess failed (exit {proc.returncode}); last output:\n{log[-6000:]}")
    return json.loads(out_file.read_text()), log


def run_vllm_data_parallel(rank_jobs: list[list[dict]], tmp_path: Path, timeout: int = 900,
                           **env: str) -> list[list[dict]]:
    """vLLM's offline data parallelism: one runner process per DP rank (rank_jobs[r] its jobs), started together
    with vLLM's VLLM_DP_* variables (a free master port), one CPU each on a CPU host; each rank's results."""
    size, cpus = len(rank_jobs), sorted(os.sched_getaffinity(0))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank, jobs in enumerate(rank_jobs):
        rank_dir = tmp_path / f"dp{rank}"
        rank_dir.mkdir()
        dp_env = dict(VLLM_DP_RANK=str(rank), VLLM_DP_RANK_LOCAL=str(rank), VLLM_DP_SIZE=str(size),
                      VLLM_DP_MASTER_IP="127.0.0.1", VLLM_DP_MASTER_PORT=str(port),
                      # the ranks' OpenMP threads on separate CPUs (vLLM picks its rank's entry)
                      VLLM_CPU_OMP_THREADS_BIND="|".join(str(cpus[r % len(cpus)]) for r in range(size)), **env)
        cmd, full_env, out_file = _runner(jobs, rank_dir, dp_env)
        log = open(rank_dir / "log.txt", "w")  # noqa: SIM115 - closed below, after the process
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT), log,
                      out_file))
    results, failures = [], []
    for rank, (proc, log, out_file) in enumerate(procs):
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if proc.returncode != 0:
            failures.append(f"DP rank {rank} failed (exit {proc.returncode}); last output:\n"
                            f"{(tmp_path / f'dp{rank}' / 'log.txt').read_text()[-4000:]}")
        else:
            results.append(json.loads(out_file.read_text()))
    if failures:
        raise AssertionError("\n".join(failures))
    return results


def parity_jobs(vllm_checkpoint, prompts, **engine_extra) -> list[dict]:
    return [{"model": str(vllm_checkpoint(name)), "prompts": prompts, "max_tokens": NEW_TOKENS,
             "rounds": 2, "engine": {**ENGINES[name], **engine_extra}} for name in CHECKPOINTS]


# The FP8 checkpoint of test_fp8_generation.py (its job joins atom_run): Qwen3-MoE in compressed-tensors FP8-Dynamic,
# float32 (vLLM's Fp8Config, the fp8 block format, takes bfloat16/float16 models only).
FP8 = (QWEN3_MOE, "channel")
FP8_PROMPTS, FP8_NEW_TOKENS = random_prompts([5, 17, 9], seed=3), 12


@pytest.fixture(scope="session")
def atom_run(vllm_checkpoint, prompts, tmp_path_factory, unsupported_checkpoint, fp8_checkpoint):
    """vLLM with the plugin (default settings: torch.compile mode, in-process engine), both
    architectures, then an architecture atom-core lacks (fallback), then an FP8 checkpoint."""
    jobs = parity_jobs(vllm_checkpoint, prompts)
    jobs.append({"model": str(unsupported_checkpoint), "prompts": prompts[:2], "max_tokens": NEW_TOKENS})
    jobs.append({"model": str(fp8_checkpoint(*FP8)[0]), "prompts": FP8_PROMPTS, "max_tokens": FP8_NEW_TOKENS,
                 "rounds": 1, "engine": {"dtype": "float32", "block_size": 32}})
    results, log = run_vllm(jobs, tmp_path_factory.mktemp("vllm_atom"), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    return dict(zip([*CHECKPOINTS, "unsupported", "fp8"], results)), log


@pytest.fixture(scope="session")
def own_run(vllm_checkpoint, prompts, tmp_path_factory):
    """vLLM's own implementations (plugin disabled), eager: the oracle needs vLLM's model, not its compiler."""
    jobs = parity_jobs(vllm_checkpoint, prompts, enforce_eager=True)
    results, log = run_vllm(jobs, tmp_path_factory.mktemp("vllm_own"), VLLM_ENABLE_V1_MULTIPROCESSING="0",
                            ATOM_DISABLE_VLLM_PLUGIN="1")
    return dict(zip(CHECKPOINTS, results)), log


@pytest.fixture(scope="session")
def unsupported_checkpoint(tmp_path_factory) -> Path:
    """A tiny Qwen2 checkpoint: an architecture vLLM has and atom-core does not."""
    import torch
    import transformers

    from atom_core.models import is_supported
    from atom_frontends.native.demo import byte_level_tokenizer

    assert not is_supported("Qwen2ForCausalLM"), "pick another architecture atom-core lacks for this test"
    path = tmp_path_factory.mktemp("qwen2")
    config = transformers.Qwen2Config(hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=320,
                                      max_position_embeddings=512, tie_word_embeddings=False,
                                      initializer_range=0.1, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).to(torch.float32).save_pretrained(path, safe_serialization=True)
    byte_level_tokenizer().save_pretrained(path)
    return path
