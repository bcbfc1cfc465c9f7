"""`atom-core serve` under load and faults (a subprocess, the real `openai` client): many concurrent clients, some
streaming, some dropping their stream mid-way, malformed and oversized requests mixed in. Every completed answer
is transformers' serial greedy answer, every dropped request is aborted, every bad one gets its 400, /metrics
and the request log (--enable-log-requests) count exactly what the clients saw, and every KV block is free at
the end. Then the engine process is killed:
the request in flight gets 503 naming the cause and the server exits non-zero."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.frontends.native.hf_oracle import hf_greedy  # noqa: E402
from tests.frontends.native.serve_process import ServeProcess  # noqa: E402

AS_IDS = {"return_tokens_as_token_ids": True}
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def ckpt(checkpoint_factory):
    return checkpoint_factory("Qwen3ForCausalLM", max_position_embeddings=4096)


@pytest.fixture(scope="module")
def tok(ckpt):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ckpt))


def _serve(ckpt, clients: int):
    srv = ServeProcess(ckpt, "--max-num-seqs", str(clients // 2), "--max-queue", str(clients),
                       "--enable-log-requests")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def server(ckpt):
    yield from _serve(ckpt, 32)


@pytest.fixture(scope="module")
def gpu_server(ckpt):
    yield from _serve(ckpt, 256)


def _metrics(server) -> dict[tuple, float]:
    """(sample name, finished_reason label or None) → value, from GET /metrics."""
    status, text = server.request("GET", "/metrics")
    assert status == 200
    return {(s.name, s.labels.get("finished_reason")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _ids(tokens: list[str]) -> list[int]:
    return [int(t.split(":")[1]) for t in tokens]


def _client(server, i: int, prompt: str) -> tuple[str, object]:
    """Client i's part by i % 8: 0 drops its stream after 2 chunks, 1 sends malformed JSON, 2 an oversized
    prompt; the others ask for greedy tokens, streamed for odd i. (kind, tokens or HTTP status)."""
    client = server.client()
    if i % 8 == 0:
        stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=3000, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        next(chunks), next(chunks)
        stream.close()
        return "dropped", None
    if i % 8 == 1:
        return "malformed", server.request("POST", "/v1/completions", b'{"model": "tiny", "prompt": [1, 2')[0]
    if i % 8 == 2:
        try:
            client.completions.create(model="tiny", prompt="x" * 5000, max_tokens=4)
        except openai.BadRequestError as e:
            return "oversized", e.status_code
        return "oversized", 200
    kw = dict(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=0, extra_body=AS_IDS)
    if i % 2:
        chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
        assert [c.finish_reason for c in chunks].count("length") == 1  # one end, after the last token
        return "completed", _ids([t for c in chunks if c.logprobs for t in c.logprobs.tokens])
    return "completed", _ids(client.completions.create(**kw).choices[0].logprobs.tokens)


def _wait_idle(server, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while (stats := server.stats())["num_requests"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return stats


def _load_and_faults(server, ckpt, tok, clients: int) -> None:
    prompts = [f"Client {i} asks: what is {i} + {2 * i}?" for i in range(clients)]
    before, stats0, logged = _metrics(server), server.stats(), server.output().count("finished (length)")
    with ThreadPoolExecutor(clients) as pool:
        got = list(pool.map(lambda i: _client(server, i, prompts[i]), range(clients)))
    kinds = [k for k, _ in got]
    completed = [i for i, k in enumerate(kinds) if k == "completed"]
    want = hf_greedy(ckpt, [tok(prompts[i]).input_ids for i in completed], MAX_TOKENS)
    assert [got[i][1] for i in completed] == want  # each once, whole, in its client's hands
    assert all(status == 400 for k, status in got if k in ("malformed", "oversized"))
    stats = _wait_idle(server)
    assert stats["num_requests"] == 0 and stats["num_free_kv_blocks"] == stats["num_kv_blocks"]
    assert stats["num_aborted_requests"] - stats0["num_aborted_requests"] == kinds.count("dropped")
    after = _metrics(server)

    def added(name: str, reason: str | None = None) -> float:
        return after.get((f"atom_core:{name}", reason), 0) - before.get((f"atom_core:{name}", reason), 0)

    assert added("request_success_total", "length") == len(completed)
    assert added("request_success_total", "abort") == kinds.count("dropped")
    started = [i for i, k in enumerate(kinds) if k in ("completed", "dropped")]  # each got a first token
    assert added("prompt_tokens_total") == sum(len(tok(prompts[i]).input_ids) for i in started)
    assert added("time_to_first_token_seconds_count") == added("e2e_request_latency_seconds_count") == len(started)
    assert added("generation_tokens_total") >= len(completed) * MAX_TOKENS + 2 * kinds.count("dropped")
    assert after[("atom_core:kv_cache_usage_perc", None)] == 0
    assert added("engine_output_delay_seconds_count") > 0  # each step's news timed on arrival
    assert server.output().count("finished (length)") - logged == len(completed)  # --enable-log-requests


def test_load_and_faults(server, ckpt, tok):
    _load_and_faults(server, ckpt, tok, 32)


@pytest.mark.gpu
def test_load_and_faults_gpu(gpu_server, ckpt, tok):
    _load_and_faults(gpu_server, ckpt, tok, 256)


def test_engine_process_death_gives_503_and_exit_1(server):
    """Last in this module: it ends the module's server."""
    body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 3000, "ignore_eos": True}).encode()
    pending = ThreadPoolExecutor(1).submit(server.request, "POST", "/v1/completions", body)
    while server.stats()["num_requests"] == 0:
        time.sleep(0.05)
    os.kill(server.stats()["engine_pid"], signal.SIGKILL)
    status, text = pending.result(timeout=60)
    assert status == 503 and "the engine process died" in json.loads(text)["error"]["message"], text
    assert server.proc.wait(60) == 1
    assert "stopped because the engine process died" in server.output()
