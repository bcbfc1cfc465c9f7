"""SGLang's OWN model on one of test_own_model_gpu.py's checkpoints under several engine-argument variants, each
against transformers' float32 greedy tokens: where SGLang's own model leaves transformers' tokens, which of its
paths does it. For the GPU machine with the carried SGLang (tools/gpu_sglang), from the checkout's root:

    python3 tools/sglang_own_variants.py deepseek-v3 [VARIANT ...]

Variants (engine arguments on top of the test's own-model settings, OWN_BACKEND / OWN_ENV / OWN_EAGER):
  base         as test_own_model_gpu.py runs it
  mla          --enable-deterministic-inference: SGLang's Triton backend then runs every DeepSeek attention call on
               the absorbed MLA path (fresh prefills otherwise take the MHA path); on CPU, so run, its tokens ==
               transformers' (docs/sglang.md)
  no-fusion    --disable-shared-experts-fusion: the shared expert as its own MLP, not a fused top-k slot
  mla-no-fusion  both
Prints, per variant, how many prompts equal transformers' tokens and each first divergence (prompt, step, float32
logit margin)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atom_frontends.native.demo import build_checkpoint  # noqa: E402
from tests.frontends.native.hf_oracle import hf_greedy, hf_model, random_prompts  # noqa: E402
from tests.frontends.sglang.conftest import PROMPT_LENGTHS  # noqa: E402
from tests.frontends.sglang.helpers import GRAPHS, NEW_TOKENS  # noqa: E402
from tests.frontends.sglang.own_model_tokens import own_model_tokens  # noqa: E402
from tests.frontends.sglang.test_own_model_gpu import CASES, OWN_BACKEND, OWN_ENV, divergence  # noqa: E402

VARIANTS = {
    "base": {},
    "mla": dict(enable_deterministic_inference=True),
    "no-fusion": dict(disable_shared_experts_fusion=True),
    "mla-no-fusion": dict(enable_deterministic_inference=True, disable_shared_experts_fusion=True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=list(CASES))
    ap.add_argument("variants", nargs="*", default=list(VARIANTS), help=f"of {list(VARIANTS)} (default: all)")
    ap.add_argument("--dir", default="/tmp/sglang-own-variants", help="where the checkpoint is written")
    args = ap.parse_args()
    (arch, overrides, engine_args), _, own_args = CASES[args.case]
    path = build_checkpoint(Path(args.dir) / args.case, arch, **overrides)
    prompts = random_prompts(PROMPT_LENGTHS, seed=7)  # the tests' prompts (conftest)
    ref = hf_greedy(path, prompts, NEW_TOKENS)
    model = hf_model(path)
    for name in args.variants:
        extra = dict(attention_backend=OWN_BACKEND, **GRAPHS, **engine_args) | own_args | VARIANTS[name]
        try:
            own = own_model_tokens(path, [prompts], extra, NEW_TOKENS, env=OWN_ENV)
        except AssertionError as e:  # SGLang refused or crashed: its last words, then the next variant
            print(f"{name}: failed\n{str(e)[-1500:]}", flush=True)
            continue
        got = [o["output_ids"] for o in own["rounds"][0]]
        report = [(i, *divergence(model, prompts[i], r, g)) for i, (r, g) in enumerate(zip(ref, got)) if r != g]
        print(f"{name}: {own['model_class']}, {len(ref) - len(report)}/{len(ref)} prompts == transformers; "
              f"first divergences (prompt, step, fp32 margin): {report}", flush=True)


if __name__ == "__main__":
    main()
