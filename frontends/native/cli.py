"""`atom-core` command line: `generate` with the native engine, `info` about this installation."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform as py_platform
import sys


def _generate(args: argparse.Namespace) -> int:
    from atom_frontends.native import LLM, SamplingParams
    from atom_frontends.native.demo import DEMO_NOTE, demo_checkpoint

    model = args.model
    if model is None:
        model = str(demo_checkpoint())
        print(f"[{DEMO_NOTE}] {model}", file=sys.stderr)
    llm = LLM(model, dtype=args.dtype, max_model_len=args.max_model_len, seed=args.seed)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed if args.temperature > 0 else None)
    prompts = args.prompt or ["Hello, my name is", "The capital of France is"]
    for out in llm.generate(prompts, params):
        print(f"--- prompt: {out.prompt!r}")
        print(f"    output: {out.text!r}")
        print(f"    tokens: {len(out.token_ids)}, finish_reason: {out.finish_reason}")
    return 0


def _info(args: argparse.Namespace) -> int:
    import torch

    import atom_kernels
    from atom_core import plugins
    from atom_core.models import supported_architectures
    from atom_frontends.native.hooks import NATIVE

    with NATIVE.scope():
        host = plugins.current_host()
        plat = plugins.current_platform()
    print(f"host:        {host}")
    print(f"platform:    device={plat.device} tp={plat.tp_rank}/{plat.tp_size}")
    print(f"frontends:   {', '.join(plugins.frontend_names())}")
    print(f"models:      {', '.join(supported_architectures())}")
    print("kernels:")
    for op, backend in atom_kernels.dispatch.describe(plat.device.type).items():
        print(f"  {op:<16} {backend}")
    print("versions:")
    for dist in ("atom-core", "torch", "transformers", "pluggy", "safetensors", "triton", "vllm", "sglang"):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        print(f"  {dist:<13} {version}")
    print(f"  {'python':<13} {py_platform.python_version()}  (cuda available: {torch.cuda.is_available()})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atom-core", description="atom-core native engine")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text with the native engine")
    gen.add_argument("--model", help="local HF checkpoint directory (default: the built-in random demo model)")
    gen.add_argument("--prompt", action="append", help="a prompt (repeat for a batch)")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--dtype", default="auto")
    gen.add_argument("--max-model-len", type=int, default=None)
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(func=_generate)
    info = sub.add_parser("info", help="host, platform, frontends, kernel backends, versions")
    info.set_defaults(func=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"atom-core: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
