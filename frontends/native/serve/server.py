"""Run the server: start the engine process (it loads the model), then uvicorn until SIGTERM/SIGINT.

Two processes: this one (HTTP, tokenizing, detokenizing, streaming) and the engine's (engine_core: schedules
and runs steps), as vLLM's and SGLang's servers run. Shutdown: uvicorn stops accepting connections and lets
responses in progress finish for up to --shutdown-timeout seconds, cancels what is left (those requests
abort), then the app's lifespan stops the engine process. The process then exits 0. If the engine process
dies, requests in flight and new ones get 503, the server stops and exits 1.
"""

from __future__ import annotations

import argparse
import logging
import signal

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> int:
    from atom_frontends.native.serve import require_serve_deps

    require_serve_deps()
    import uvicorn

    from atom_frontends.native.async_engine import AsyncLLMEngine
    from atom_frontends.native.cli import engine_kwargs
    from atom_frontends.native.engine_args import EngineArgs
    from atom_frontends.native.engine_core import frozen_heap
    from atom_frontends.native.serve.app import build_app

    engine = AsyncLLMEngine(EngineArgs(model=args.model, max_num_seqs=args.max_num_seqs, **engine_kwargs(args)),
                            max_queue=args.max_queue)
    try:
        names = args.served_model_name or [args.model]
        app = build_app(engine, names, args.model, args.shutdown_timeout, args.enable_log_requests)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                                timeout_graceful_shutdown=args.shutdown_timeout,
                                access_log=not args.disable_uvicorn_access_log)
        server = uvicorn.Server(config)
        engine.on_dead = lambda: setattr(server, "should_exit", True)
        log.info("atom-core: serving %s as %s on http://%s:%d (engine process %d)", args.model, names, args.host,
                 args.port, engine.process.pid)
        # uvicorn catches SIGTERM/SIGINT, shuts down, then raises the signal again to run the handler it found
        # first: the default ones would kill the process after a clean shutdown (exit -15, or a KeyboardInterrupt
        # traceback). Ours have nothing left to do.
        previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            with frozen_heap():
                server.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        engine.close()
    if engine.dead_reason is not None:
        log.error("atom-core: stopped because %s", engine.dead_reason)
        return 1
    return 0
