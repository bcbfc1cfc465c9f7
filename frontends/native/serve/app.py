"""The OpenAI-compatible FastAPI app over an AsyncLLMEngine.

Routes: POST /v1/completions, POST /v1/chat/completions (JSON, or server-sent events with stream=true),
GET /v1/models, GET /health, GET /stats (the engine's KV blocks, sequences, aborts: JSON), GET /metrics
(Prometheus). Errors are OpenAI's shape: 400 for a request that cannot be served (bad values, malformed JSON,
unknown model, prompt too long), 503 when the engine is full, stopping or dead. A client that goes away
aborts its requests (their KV blocks are freed at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from atom_frontends.native.async_engine import AsyncLLMEngine, EngineStoppedError, QueueFullError
from atom_frontends.native.request import RequestOutput
from atom_frontends.native.request_stream import RequestStream
from atom_frontends.native.sampling_params import SamplingParams
from atom_frontends.native.serve.metrics import Metrics, RequestLog
from atom_frontends.native.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    error_body,
)
from atom_frontends.native.serve.responses import ChatCompletions, Choice, Completions, sse, usage

log = logging.getLogger(__name__)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """(message, param) of pydantic's first complaint, e.g. ('temperature: Input should be a valid number')."""
    err = exc.errors()[0]
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    if err.get("type") == "json_invalid":
        return f"the body is not valid JSON: {err.get('msg')} (at character {loc[-1] if loc else '?'})", None
    where = ".".join(loc)
    return (f"{where}: {err.get('msg')}" if where else str(err.get("msg"))), (loc[0] if loc else None)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)  # FastAPI's 422 → OpenAI's 400
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(error_body(message, param=param), status_code=400)

    @app.exception_handler(RequestError)
    async def bad_request(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), param=exc.param, code=exc.code), status_code=400)

    @app.exception_handler(QueueFullError)
    async def full(_: Request, exc: QueueFullError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "service_unavailable_error", code="queue_full"), status_code=503)

    @app.exception_handler(EngineStoppedError)
    async def stopped(_: Request, exc: EngineStoppedError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "service_unavailable_error"), status_code=503)


async def _merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, delta) of several streams as they come; aborts what is left when closed early."""
    if len(streams) == 1:  # the common case, without a task and a queue hop per delta
        try:
            async for d in streams[0]:
                yield 0, d
        finally:
            streams[0].abort()
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s: RequestStream) -> None:
        try:
            async for d in s:
                q.put_nowait((i, d))
            q.put_nowait((i, None))
        except Exception as e:  # an engine error: the consumer raises it
            q.put_nowait((i, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        for _ in range(len(streams)):
            while True:
                i, d = await q.get()
                if d is None:
                    break
                if isinstance(d, Exception):
                    raise d
                yield i, d
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.abort()


async def _until_disconnect(request: Request, work):
    """Await `work`; if the client disconnects first, cancel it (its requests abort) and answer nothing."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        log.info("atom-core: client gone; its request was aborted")
        return Response(status_code=499)
    return task.result()


class OpenAIServer:
    def __init__(self, engine: AsyncLLMEngine, served_model_names: list[str], model_path: str) -> None:
        self.engine, self.names, self.model_path = engine, served_model_names, model_path
        self.max_model_len = engine.max_model_len
        self.created = int(time.time())

    def check_model(self, name: str) -> None:
        if name not in self.names:
            raise RequestError(f"the model `{name}` does not exist; this server serves {self.names}", "model",
                               "model_not_found")

    async def add(self, prompts: list, params: SamplingParams, chat: ChatCompletionRequest | None) -> list:
        """Queue every prompt (or the conversation); a bad one aborts those already queued → 400 naming it."""
        streams: list[RequestStream] = []
        try:
            for i, p in enumerate(prompts):
                try:
                    if chat is None:
                        streams.append(await self.engine.add_request(p, params))
                    else:
                        streams.append(await self.engine.add_chat_request(
                            p, params, chat_template=chat.chat_template,
                            add_generation_prompt=chat.add_generation_prompt,
                            chat_template_kwargs=chat.chat_template_kwargs))
                except (ValueError, TypeError) as e:
                    where = "messages" if chat is not None else "prompt" if len(prompts) == 1 else f"prompt[{i}]"
                    raise RequestError(f"{where}: {e}", "messages" if chat is not None else "prompt") from None
        except BaseException:
            for s in streams:
                s.abort()
            raise
        return streams

    async def answer(self, request: Request, body, builder: Completions, prompts: list, chat) -> Response:
        params = body.to_params(self.max_model_len)
        if params.n > self.engine.capacity:  # could never run: not a 503 to retry
            raise RequestError(f"n={params.n} is more than this server runs and queues at once "
                               f"({self.engine.capacity}); ask for fewer samples", "n")
        streams = await self.add(prompts, params, chat)
        if body.stream:
            events = self.events(streams, builder, params.n, body.include_usage())
            return StreamingResponse(events, media_type="text/event-stream")
        return await _until_disconnect(request, self.collect(streams, builder, params.n))

    async def collect(self, streams: list[RequestStream], builder: Completions, n: int) -> JSONResponse:
        choices: dict[int, Choice] = {}
        async for i, d in _merged(streams):
            for c in d.outputs:
                choices.setdefault(i * n + c.index, Choice(i * n + c.index)).add(c)
        ordered = [builder.choice(k, choices[k]) for k in sorted(choices)]
        done = sum(len(c.token_ids) for c in choices.values())
        return JSONResponse(builder.body(ordered, usage(sum(len(s.prompt_token_ids) for s in streams), done)))

    async def events(self, streams: list[RequestStream], builder: Completions, n: int,
                     include_usage: bool) -> AsyncIterator[str]:
        """The SSE body: chunks as tokens come, a usage chunk if asked, `data: [DONE]`. An engine error after
        the first chunk can only be told in the stream: an error event, then [DONE]."""
        done = 0
        try:
            async for i, d in _merged(streams):
                choices = [ch for c in d.outputs if (ch := builder.chunk_choice(i * n + c.index, c)) is not None]
                done += sum(len(c.token_ids) for c in d.outputs)
                if choices:
                    yield sse(builder.body(choices, None, chunk=True))
            if include_usage:
                yield sse(builder.body([], usage(sum(len(s.prompt_token_ids) for s in streams), done), chunk=True))
        except Exception as e:
            log.exception("atom-core: a streamed request failed")
            yield sse(error_body(str(e), "server_error"))
        finally:
            for s in streams:  # the client went away (this generator is closed early): free the blocks now
                s.abort()
        yield sse("[DONE]")


def build_app(engine: AsyncLLMEngine, served_model_names: list[str], model_path: str,
              shutdown_timeout: float = 5.0, log_requests: bool = False) -> FastAPI:
    """The app; its lifespan starts taking the engine's news and, at shutdown, stops the engine process (it
    aborts what is left)."""
    server = OpenAIServer(engine, served_model_names, model_path)
    metrics = Metrics(served_model_names[0])
    engine.observers += [metrics, RequestLog()] if log_requests else [metrics]

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        engine.start()
        yield
        await engine.shutdown(shutdown_timeout)

    app = FastAPI(title="atom-core", lifespan=lifespan)
    _install_error_handlers(app)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        server.check_model(body.model)
        builder = Completions(body.model, body.logprobs, body.return_tokens_as_token_ids)
        return await server.answer(request, body, builder, body.prompts(), None)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        server.check_model(body.model)
        builder = ChatCompletions(body.model, body.top_logprobs or 0, body.return_tokens_as_token_ids)
        return await server.answer(request, body, builder, [body.conversation()], body)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": server.created, "owned_by": "atom-core",
             "root": model_path, "max_model_len": server.max_model_len} for name in served_model_names]}

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.running else 503)

    @app.get("/stats")
    async def stats() -> dict:
        """The engine's snapshot after its last step: KV blocks (total, free), sequences running / waiting,
        live and aborted requests, preemptions; the engine process's pid."""
        return dict(engine.stats)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
