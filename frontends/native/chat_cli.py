"""`atom-core chat`: an interactive terminal chat with the native engine (multi-turn, streamed, chat template).
Ctrl-C stops the answer being written; Ctrl-D or `exit` leaves."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TextIO

EXIT_WORDS = ("exit", "quit", "/exit", "/quit")


def stream_answer(engine, conversation: list[dict], params, out: TextIO) -> str:
    """Generate the assistant's next message, writing its text to `out` as tokens come; returns the text.
    Ctrl-C (SIGINT) aborts the request; what was written is returned."""
    from atom_frontends.native.llm import render_chat

    text, ids = render_chat(engine.tokenizer, conversation, None, True, {})
    rid = engine.enqueue(*engine.inputs.check_prompt(ids), engine.inputs.check_params(params), stream=True)
    shown, stop = "", []
    # Ctrl-C is noted and acted on between steps: an interrupt inside a step would leave the engine half-way.
    previous = signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    try:
        while engine.has_unfinished():
            done = [o for o in engine.step() if o.request_id == rid]
            o = done[0] if done else engine.current_output(rid)
            if o is not None and o.outputs[0].text.startswith(shown):
                out.write(o.outputs[0].text[len(shown):])
                out.flush()
                shown = o.outputs[0].text
            if done:
                break
            if stop:
                engine.abort(rid)
                while engine.has_unfinished():  # collect the aborted request
                    engine.step()
                out.write(" [stopped]")
                break
    finally:
        signal.signal(signal.SIGINT, previous)
    out.write("\n")
    out.flush()
    return shown


def run_chat(args: argparse.Namespace) -> int:
    from atom_frontends.native import LLM, SamplingParams
    from atom_frontends.native.cli import engine_kwargs

    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens)
    llm = LLM(args.model, **engine_kwargs(args))
    tokenizer = llm.tokenizer
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{args.model} has no tokenizer with a chat template: `atom-core chat` needs one "
                         "(use `atom-core generate --no-chat` for raw completion)")
    history = [{"role": "system", "content": args.system}] if args.system else []
    print(f"atom-core chat with {args.model_label}: Ctrl-C stops an answer, Ctrl-D or 'exit' leaves.",
          file=sys.stderr)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:  # at the prompt: drop the line, ask again
            print()
            continue
        if line.strip().lower() in EXIT_WORDS:
            return 0
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        history.append({"role": "assistant", "content": stream_answer(llm.engine, history, params, sys.stdout)})
