"""Greedy tokens of SGLang's OWN model (not atom-core's) in a real sglang.Engine, from a process of its own.

SGLang reads SGLANG_EXTERNAL_MODEL_PACKAGE when sglang.srt.models.registry is first imported, in every process it
starts; conftest.py sets it in the test process, whose registry then serves atom-core's classes. So SGLang's own
model only runs in a process started without it: `own_model_tokens()` starts this module
(`python -m tests.frontends.sglang.own_model_tokens SPEC`) with that variable removed from the environment.

SPEC (JSON): model_path; rounds, lists of prompts (token ids) generated one round after the other on one engine (a
later round can hit the radix cache); engine_args, overrides of helpers.ENGINE_ARGS; max_tokens; ignore_eos. The last
stdout line that starts with MARKER carries the result: model_class, the class SGLang's registry resolves the
checkpoint's architecture to in this process (the engine's processes inherit its environment, so they resolve the same);
attention_backend and decode_graph (the decode phase's CUDA graph backend, "disabled" when off) as the engine
resolved them; rounds: per round, per prompt, output_ids and cached_tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXTERNAL = "SGLANG_EXTERNAL_MODEL_PACKAGE"
MODULE = "tests.frontends.sglang.own_model_tokens"
MARKER = "OWN_MODEL_TOKENS "  # SGLang's processes may print to stdout too: the result is the line marked so
REPO = Path(__file__).resolve().parents[3]


def own_model_tokens(path, rounds: list[list[list[int]]], engine_args: dict, max_tokens: int,
                     env: dict[str, str] | None = None, timeout: float = 1800, ignore_eos: bool = False) -> dict:
    """This module's result for `path`, run in a fresh process: this environment without EXTERNAL, plus `env`."""
    spec = dict(model_path=str(path), rounds=rounds, engine_args=engine_args, max_tokens=max_tokens,
                ignore_eos=ignore_eos)
    child_env = {k: v for k, v in os.environ.items() if k != EXTERNAL} | (env or {})
    proc = subprocess.run([sys.executable, "-m", MODULE, json.dumps(spec)], cwd=REPO, env=child_env,
                          capture_output=True, text=True, timeout=timeout)
    results = [line[len(MARKER):] for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if proc.returncode != 0 or not results:
        raise AssertionError(f"SGLang's own model failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-8000:]}")
    return json.loads(results[-1])


def main(spec: dict) -> dict:
    if EXTERNAL in os.environ:  # checked before anything imports SGLang's registry
        raise SystemExit(f"{EXTERNAL} is set: SGLang would serve atom-core's model, not its own")
    from sglang.srt.models.registry import ModelRegistry

    from tests.frontends.sglang.helpers import generate, sglang_engine

    path = Path(spec["model_path"])
    model_cls, _ = ModelRegistry.resolve_model_cls(json.loads((path / "config.json").read_text())["architectures"])
    with sglang_engine(path, **spec["engine_args"]) as engine:
        info = engine.get_server_info()
        rounds = [[dict(output_ids=o["output_ids"], cached_tokens=o["meta_info"]["cached_tokens"])
                   for o in generate(engine, prompts, spec["max_tokens"], spec["ignore_eos"])]
                  for prompts in spec["rounds"]]
    return dict(model_class=f"{model_cls.__module__}.{model_cls.__qualname__}",
                attention_backend=info["attention_backend"],
                decode_graph=info["cuda_graph_config"]["decode"]["backend"], rounds=rounds)


if __name__ == "__main__":
    print(MARKER + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
