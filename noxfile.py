"""Sessions: lint (ruff), tests (CPU: kernels reference + core + native). Each host gets its own venv.

`nox` runs the default sessions; `nox -s gpu` is for a GPU machine (Triton kernels, CUDA graphs).
Reuse venvs locally with `nox -r`.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]
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
