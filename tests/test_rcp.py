"""The RCP server, driven by the official `rcp` client over HTTP and stdio."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rcp
from llama_index.core import Document, VectorStoreIndex
from typer.testing import CliRunner

from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.server.http import RcpHttpServer
from llama_index_hyde_plus.server.rcp import (
    MAX_BATCH,
    MAX_N,
    TransformService,
    build_server,
)
from llama_index_hyde_plus.stores.faiss import build_faiss_index
from llama_index_hyde_plus.testing import ScriptedLLM, echo_llm

from .conftest import DOCS, Served

METHODS = ["hyde", "multi-query", "step-back", "decompose", "rewrite", "condense"]


@pytest.fixture
def http_server(faiss_index: VectorStoreIndex) -> Iterator[RcpHttpServer]:
    service = TransformService(echo_llm(), faiss_index.as_retriever(similarity_top_k=10))
    server = RcpHttpServer(build_server(service, http=True)).start()
    yield server
    server.stop()


@pytest.fixture
def client(http_server: RcpHttpServer) -> rcp.Client:
    return rcp.connect_http(http_server.url)


def code_of(call) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(rcp.RcpError) as info:
        call()
    return int(info.value.code)


def raw_post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_initialize_advertises_exactly_our_methods(client: rcp.Client) -> None:
    caps = client.capabilities
    assert caps["transform"]["methods"] == METHODS
    assert caps["retrieve"]["rewrite"] == METHODS and caps["retrieve"]["maxK"] == 100
    assert client.server["name"] == "hyde-plus"


def test_http_binds_loopback_by_default(http_server: RcpHttpServer) -> None:
    assert http_server.address[0] == "127.0.0.1"


@pytest.mark.parametrize("method", METHODS)
def test_every_transform_method(client: rcp.Client, method: str) -> None:
    result = client.transform("Why did revenue drop?", method)
    assert result["queries"] and all(isinstance(q, str) for q in result["queries"])
    assert result["usage"]["llmCalls"] in (0, 1) and result["usage"]["latencyMs"] >= 0
    if method == "hyde":
        assert "Why did revenue drop? explained" in result["hypothetical"]
        assert result["queries"] == ["Why did revenue drop?"]
    else:
        assert "hypothetical" not in result


def test_usage_reports_tokens_and_cache(client: rcp.Client) -> None:
    first = client.call("query/transform", {"query": "fresh question", "method": "rewrite"})
    second = client.call("query/transform", {"query": "fresh question", "method": "rewrite"})
    assert first["usage"]["totalTokens"] > 0 and first["usage"]["llmCalls"] == 1
    assert second["usage"]["cached"] is True and second["usage"]["llmCalls"] == 0


def test_n_is_honoured_and_clamped(client: rcp.Client) -> None:
    two = client.call("query/transform", {"query": "q", "method": "multi-query", "n": 2})
    assert len(two["queries"]) == 2
    many = client.call("query/transform", {"query": "q2", "method": "decompose", "n": 50})
    assert 1 <= len(many["queries"]) <= MAX_N


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"query": "q", "method": "multi-query", "n": 0}, rcp.Errc.INVALID_PARAMS),
        ({"query": "q", "method": "multi-query", "n": "3"}, rcp.Errc.INVALID_PARAMS),
        ({"query": "x" * 2001, "method": "hyde"}, rcp.Errc.INVALID_PARAMS),
        ({"query": "   ", "method": "hyde"}, rcp.Errc.INVALID_PARAMS),
        ({"query": 42, "method": "hyde"}, rcp.Errc.INVALID_PARAMS),
        ({"method": "hyde"}, rcp.Errc.INVALID_PARAMS),
        ({"query": "q", "method": 7}, rcp.Errc.INVALID_PARAMS),
        ({"query": "q", "method": "telepathy"}, rcp.Errc.OPTION_UNSUPPORTED),
        ({"query": "q", "method": "hyde", "temperature": 2}, rcp.Errc.OPTION_UNSUPPORTED),
    ],
)
def test_transform_errors_use_protocol_codes(client: rcp.Client, params: dict, code: int) -> None:
    assert code_of(lambda: client.call("query/transform", params)) == code
    assert client.transform("still serving", "rewrite")["queries"]


def test_retrieve_with_rewrite_and_k(client: rcp.Client) -> None:
    out = client.search("Why did revenue drop?", k=3, opts={"rewrite": "multi-query"})
    assert len(out["hits"]) == 3 and {h["id"] for h in out["hits"]} <= set(DOCS)
    assert out["usage"]["latencyMs"] > 0
    plain = client.search("paid time off days", k=2)
    assert plain["hits"][0]["id"] == "pto" and len(plain["hits"]) == 2
    raw = client.call("retrieve", {"query": "q", "k": 2, "rewrite": {"method": "hyde"}})
    assert raw["rewrite"]["method"] == "hyde" and raw["rewrite"]["hypothetical"]


def serve_service(service: TransformService) -> Iterator[rcp.Client]:
    server = RcpHttpServer(build_server(service, http=True)).start()
    try:
        yield rcp.connect_http(server.url)
    finally:
        server.stop()


@pytest.mark.parametrize("version", ["1.0", 2, 2.0, "2", None], ids=repr)
def test_a_call_that_is_not_json_rpc_2_0_is_an_invalid_request(
    http_server: RcpHttpServer, version: object
) -> None:
    call: dict[str, object] = {"id": 7, "method": "ping", "params": {"nonce": "v1"}}
    if version is not None:
        call["jsonrpc"] = version
    status, reply = raw_post(http_server.url, json.dumps(call).encode())
    assert status == 200 and reply["id"] == 7 and "result" not in reply
    assert reply["error"]["code"] == rcp.Errc.INVALID_REQUEST
    assert reply["error"]["data"] == {"field": "jsonrpc"}
    notification = {k: v for k, v in call.items() if k != "id"}
    assert build_server(TransformService(echo_llm())).handle_line(json.dumps(notification)) == ""


def test_results_say_the_rewrite_was_applied(client: rcp.Client) -> None:
    out = client.transform("Why did revenue drop?", "multi-query")
    assert out["_meta"]["transform"] == {"method": "multi-query", "status": "applied"}
    assert out["usage"]["transformStatus"] == "applied"
    found = client.search("Why did revenue drop?", k=2, opts={"rewrite": "hyde"})
    assert found["usage"]["transformStatus"] == "applied"
    plain = client.call("retrieve", {"query": "paid time off", "k": 2})
    assert plain["_meta"]["transform"] == {"method": "none", "status": "none"}


def test_a_timed_out_rewrite_says_it_fell_back_over_rcp(faiss_index: VectorStoreIndex) -> None:
    slow = echo_llm(delay=5.0)  # outlives the 0.2 s timeout
    service = TransformService(slow, faiss_index.as_retriever(similarity_top_k=10), timeout=0.2)
    for client in serve_service(service):
        out = client.transform("Why did revenue drop?", "rewrite")
        meta = out["_meta"]["transform"]
        assert meta["status"] == "fallback" and "LLMTimeoutError" in meta["reason"]
        assert out["usage"]["transformStatus"] == "fallback" and out["fallback"] is True
        found = client.search("Why did revenue slip?", k=2, opts={"rewrite": "hyde"})
        assert found["usage"]["transformStatus"] == "fallback"  # what `search` keeps
        raw = client.call("retrieve", {"query": "Who was hired?", "k": 2, "rewrite": "hyde"})
        assert raw["_meta"]["transform"]["status"] == "fallback"
        assert raw["rewrite"]["status"] == "fallback" and raw["rewrite"]["reason"]


def test_a_gated_rewrite_says_it_was_skipped_over_rcp(faiss_index: VectorStoreIndex) -> None:
    service = TransformService(
        echo_llm(),
        faiss_index.as_retriever(similarity_top_k=10),
        options={"hyde": {"gate": 0.999}},  # no passage agrees this closely
    )
    for client in serve_service(service):
        raw = client.call("retrieve", {"query": "Why did revenue drop?", "k": 2, "rewrite": "hyde"})
        assert raw["_meta"]["transform"]["status"] == "skipped"
        assert "gate" in raw["_meta"]["transform"]["reason"]
        assert raw["usage"]["transformStatus"] == "skipped"


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"query": "q", "rewrite": "telepathy"}, rcp.Errc.OPTION_UNSUPPORTED),
        ({"query": "q", "filter": {"year": 2020}}, rcp.Errc.OPTION_UNSUPPORTED),
        ({"query": "q", "k": 0}, rcp.Errc.INVALID_PARAMS),
        ({"query": "q", "rewrite": 5}, rcp.Errc.INVALID_PARAMS),
        ({"query": "q", "rewrite": {"method": "hyde", "n": -1}}, rcp.Errc.INVALID_PARAMS),
    ],
)
def test_retrieve_errors(client: rcp.Client, params: dict, code: int) -> None:
    assert code_of(lambda: client.call("retrieve", params)) == code


def test_unknown_and_unadvertised_rpc_methods(client: rcp.Client) -> None:
    assert code_of(lambda: client.call("foo/bar", {})) == rcp.Errc.UNKNOWN_METHOD
    assert code_of(lambda: client.call("embed", {"inputs": ["x"]})) == rcp.Errc.CAPABILITY_MISSING


def test_malformed_json_and_wrong_types_over_http(http_server: RcpHttpServer) -> None:
    status, body = raw_post(http_server.url, b"{not json")
    assert status == 200 and body["error"]["code"] == rcp.Errc.PARSE_ERROR
    status, body = raw_post(http_server.url, b'{"jsonrpc": "2.0", "id": 1, "params": {}}')
    assert body["error"]["code"] == rcp.Errc.INVALID_REQUEST
    client = rcp.connect_http(http_server.url)  # still serving
    assert client.transform("q", "rewrite")["queries"]


def test_calls_before_initialize_are_refused(faiss_index: VectorStoreIndex) -> None:
    service = TransformService(echo_llm(), faiss_index.as_retriever())
    server = RcpHttpServer(build_server(service, http=True)).start()
    try:
        req = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "query/transform",
            "params": {"query": "q", "method": "hyde"},
        }
        _, body = raw_post(server.url, json.dumps(req).encode())
        assert body["error"]["code"] == rcp.Errc.NOT_INITIALIZED
    finally:
        server.stop()


def test_many_clients_may_initialize_over_http(http_server: RcpHttpServer) -> None:
    clients = [rcp.connect_http(http_server.url) for _ in range(3)]
    assert all(c.transform("q", "rewrite")["queries"] for c in clients)


def test_token_is_required_when_set(faiss_index: VectorStoreIndex) -> None:
    service = TransformService(echo_llm(), faiss_index.as_retriever())
    server = RcpHttpServer(build_server(service, http=True), token="s3cret").start()
    try:
        # the official client sends no Authorization header: refused with -32012
        assert code_of(lambda: rcp.connect_http(server.url)) == rcp.Errc.UNAUTHORIZED
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        status, body = raw_post(
            server.url, json.dumps(init).encode(), {"Authorization": "Bearer wrong"}
        )
        assert status == 401 and body["error"]["code"] == rcp.Errc.UNAUTHORIZED
        status, body = raw_post(
            server.url, json.dumps(init).encode(), {"Authorization": "Bearer s3cret"}
        )
        assert status == 200 and body["result"]["capabilities"]["transform"]
    finally:
        server.stop()


def test_oversized_body_is_refused_before_it_is_read(http_server: RcpHttpServer) -> None:
    import http.client

    host, port = http_server.address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.putrequest("POST", "/rcp")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(2 << 20))
    conn.endheaders()
    resp = conn.getresponse()
    body = json.loads(resp.read())
    conn.close()
    assert resp.status == 413 and body["error"]["code"] == rcp.Errc.PAYLOAD_TOO_LARGE


def test_concurrent_clients(http_server: RcpHttpServer) -> None:
    errors: list[Exception] = []

    def work(i: int) -> None:
        try:
            c = rcp.connect_http(http_server.url)
            for j in range(5):
                assert c.transform(f"question {i} {j}", "multi-query")["queries"]
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.fixture(scope="module")
def disk_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llama_index_hyde_plus.local import local_embedding

    out = tmp_path_factory.mktemp("rcp") / "index"
    docs = [Document(text=text, id_=nid) for nid, text in DOCS.items()]
    build_faiss_index(docs, local_embedding(), out, embed_spec="local", max_length=256)
    return out


def serve_argv(index: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "llama_index_hyde_plus.cli",
        "serve",
        "--stdio",
        "--index",
        str(index),
        "--llm",
        "scripted",
    ]


@pytest.mark.local
def test_stdio_every_method_and_error_with_the_official_client(disk_index: Path) -> None:
    client = rcp.connect_stdio(serve_argv(disk_index))
    try:
        assert client.capabilities["transform"]["methods"] == METHODS
        for method in METHODS:
            assert client.transform("Why did revenue drop?", method)["queries"]
        two = client.call("query/transform", {"query": "q", "method": "decompose", "n": 2})
        assert len(two["queries"]) == 2
        hits = client.retrieve("paid time off each year", k=2, opts={"rewrite": "rewrite"})
        assert len(hits) == 2 and hits[0]["id"] in DOCS
        assert (
            code_of(lambda: client.call("query/transform", {"query": "q", "method": "x"})) == -32005
        )
        assert (
            code_of(
                lambda: client.call("query/transform", {"query": "q", "method": "hyde", "n": 0})
            )
            == -32602
        )
        assert code_of(lambda: client.call("nope", {})) == rcp.Errc.UNKNOWN_METHOD
        lone = {"query": "a \ud800 b", "method": "hyde"}  # not encodable text
        assert code_of(lambda: client.call("query/transform", lone)) == -32602
        assert client.ping(nonce="abc") == {"nonce": "abc"}
    finally:
        client.shutdown()


@pytest.mark.local
def test_stdio_malformed_json_and_calls_before_initialize(disk_index: Path) -> None:
    lines = [
        '{"jsonrpc": "2.0", "id": 1, "method": "query/transform", "params": {"query": "q", "method": "hyde"}}',
        "{broken json",
        '{"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"protocolVersion": 1}}',
        '{"jsonrpc": "2.0", "id": 3, "method": "query/transform", "params": {"query": "q", "method": "rewrite"}}',
        '{"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {}}',
        '{"jsonrpc": "2.0", "id": 5, "method": "shutdown"}',
    ]
    proc = subprocess.run(
        serve_argv(disk_index),
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    assert replies[0]["error"]["code"] == rcp.Errc.NOT_INITIALIZED
    assert replies[1]["error"]["code"] == rcp.Errc.PARSE_ERROR
    assert replies[2]["result"]["capabilities"]["transform"]["methods"] == METHODS
    assert replies[3]["result"]["queries"]
    assert replies[4]["error"]["code"] == rcp.Errc.INVALID_REQUEST  # one handshake per session
    assert replies[5] == {"jsonrpc": "2.0", "id": 5, "result": {}}


# -- hardening ---------------------------------------------------------------

CLI = [sys.executable, "-m", "llama_index_hyde_plus.cli", "serve"]
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}


def frame(method: str, params: dict | None = None, id_: object = 1) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": id_, "method": method, "params": params or {}}
    ).encode()


def no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_a_bogus_initialize_never_locks_other_http_clients(http_server: RcpHttpServer) -> None:
    alice = rcp.connect_http(http_server.url)
    hostile = [
        b'{"jsonrpc": "2.0", "method": "initialize", "params": {"protocolVersion": 0}}',
        frame("initialize", {"protocolVersion": 0}),
        b'{"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {"protocolVersion": 1e999}}',
        frame("initialize", {"protocolVersion": "one"}),
        frame("initialize", {"protocolVersion": -5}),
    ]
    for body in hostile:
        raw_post(http_server.url, body)
        assert alice.transform("still mine", "rewrite")["queries"]
    assert rcp.connect_http(http_server.url).transform("newcomer", "rewrite")["queries"]


def test_a_failed_handshake_does_not_unlock_gated_calls(faiss_index: VectorStoreIndex) -> None:
    service = TransformService(echo_llm(), faiss_index.as_retriever())
    server = RcpHttpServer(build_server(service, http=True)).start()
    try:
        transform = frame("query/transform", {"query": "q", "method": "hyde"})
        _, body = raw_post(server.url, frame("initialize", {"protocolVersion": 0}))
        assert body["error"]["code"] == rcp.Errc.VERSION_MISMATCH
        _, body = raw_post(server.url, transform)
        assert body["error"]["code"] == rcp.Errc.NOT_INITIALIZED
        rcp.connect_http(server.url)  # a valid handshake unlocks, for every client
        _, body = raw_post(server.url, transform)
        assert body["result"]["queries"]
    finally:
        server.stop()


DEEP = 600


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1e999}}',
            rcp.Errc.INVALID_PARAMS,
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": true}}',
            rcp.Errc.INVALID_PARAMS,
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"nonce": '
            + b"[" * DEEP
            + b"]" * DEEP
            + b"}}",
            rcp.Errc.INVALID_REQUEST,
        ),
        (b"[" * 100_000 + b"]" * 100_000, rcp.Errc.PARSE_ERROR),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, rcp.Errc.PARSE_ERROR),
        (frame("ping", id_={"an": "object"}), rcp.Errc.INVALID_REQUEST),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": "nonce"}',
            rcp.Errc.INVALID_PARAMS,
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": ["nonce"]}',
            rcp.Errc.INVALID_PARAMS,
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"n": 1'
            + b"0" * 5000
            + b"}}",
            rcp.Errc.PARSE_ERROR,
        ),
        (json.dumps([INIT] * (MAX_BATCH + 1)).encode(), rcp.Errc.INVALID_REQUEST),
        (b"", rcp.Errc.INVALID_REQUEST),
        (b"\xff\xfe\x00garbage", rcp.Errc.PARSE_ERROR),
    ],
    ids=[
        "version-1e999",
        "version-bool",
        "nested-600",
        "nested-100000",
        "objects-50000",
        "id-object",
        "params-string",
        "params-list",
        "5000-digit-number",
        "batch-over-limit",
        "empty-body",
        "garbage-bytes",
    ],
)
def test_hostile_frames_over_http_get_a_json_rpc_error_and_the_server_lives(
    http_server: RcpHttpServer, body: bytes, code: int
) -> None:
    status, reply = raw_post(http_server.url, body)
    assert status == 200 and reply["jsonrpc"] == "2.0" and reply["error"]["code"] == code
    assert rcp.connect_http(http_server.url).ping(nonce="alive") == {"nonce": "alive"}


def test_batch_limit_is_stated_and_a_batch_at_the_limit_is_served(
    http_server: RcpHttpServer,
) -> None:
    _, reply = raw_post(http_server.url, json.dumps([INIT] * (MAX_BATCH + 1)).encode())
    assert reply["error"]["data"] == {"maxBatch": MAX_BATCH}
    assert str(MAX_BATCH) in reply["error"]["message"]
    pings = [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(MAX_BATCH)]
    status, replies = raw_post(http_server.url, json.dumps(pings).encode())
    assert status == 200 and [r["id"] for r in replies] == list(range(MAX_BATCH))  # type: ignore[index]


def test_requests_are_served_concurrently() -> None:
    service = TransformService(echo_llm(delay=0.5))
    server = RcpHttpServer(build_server(service, http=True)).start()
    try:
        rcp.connect_http(server.url)
        results: list[float] = []

        def call(i: int) -> None:
            start = time.perf_counter()
            raw_post(server.url, frame("query/transform", {"query": f"q{i}", "method": "rewrite"}))
            results.append(time.perf_counter() - start)

        wall = time.perf_counter()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - wall
        assert len(results) == 8 and wall < 2.5  # one at a time would take 4 s
    finally:
        server.stop()


def test_requests_over_the_in_flight_limit_get_503_busy() -> None:
    from llama_index_hyde_plus.server.http import Limits

    service = TransformService(echo_llm(delay=1.0))
    server = RcpHttpServer(build_server(service, http=True), limits=Limits(max_inflight=2)).start()
    try:
        rcp.connect_http(server.url)
        replies: list[tuple[int, dict]] = []

        def call(i: int) -> None:
            body = frame("query/transform", {"query": f"busy {i}", "method": "rewrite"})
            replies.append(raw_post(server.url, body))

        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = sorted(status for status, _ in replies)
        assert statuses.count(200) >= 2 and 503 in statuses
        busy = next(body for status, body in replies if status == 503)
        assert busy["error"]["code"] == rcp.Errc.BACKEND_UNAVAILABLE
        assert "in flight" in busy["error"]["message"] and busy["error"]["data"]["retryable"]
        _, body = raw_post(server.url, frame("ping"))  # served again once it drains
        assert body["result"] == {}
    finally:
        server.stop()


def test_rewrite_object_needs_a_method(client: rcp.Client) -> None:
    with pytest.raises(rcp.RcpError) as info:
        client.call("retrieve", {"query": "q", "rewrite": {"n": 2}})
    assert info.value.code == rcp.Errc.INVALID_PARAMS
    assert info.value.data == {"field": "rewrite.method"} and "method" in info.value.message
    with pytest.raises(rcp.RcpError) as info:
        client.call("retrieve", {"query": "q", "rewrite": {"method": "hyde", "temperature": 1}})
    assert info.value.code == rcp.Errc.OPTION_UNSUPPORTED
    with pytest.raises(rcp.RcpError) as info:
        client.call("retrieve", {"query": "q", "rewrite": {"method": None}})
    assert info.value.code == rcp.Errc.INVALID_PARAMS


def test_an_empty_token_is_refused_by_the_library() -> None:
    with pytest.raises(ValueError, match="empty"):
        RcpHttpServer(build_server(TransformService(echo_llm()), http=True), token="")


def test_transform_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout"):
        TransformService(echo_llm(), timeout=0)


# -- the `serve` command -----------------------------------------------------------------


def serve_error(*args: str, env: dict[str, str] | None = None) -> str:
    """Run ``hyde-plus serve ARGS`` in-process; assert it failed with exactly one
    ``error:`` line and no traceback; return the whole of stderr, unwrapped."""
    result = CliRunner().invoke(app, ["serve", *args], env=env)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not a crash
    no_traceback(result.stderr)
    assert len([ln for ln in result.stderr.splitlines() if ln.startswith("error:")]) == 1
    return " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--token", "pässword"], {}), ([], {"HYDE_PLUS_TOKEN": "\u20ac-token"})],
    ids=["--token latin-1", "HYDE_PLUS_TOKEN above U+00FF"],
)
def test_serve_refuses_a_non_ascii_token_at_start(args: list[str], env: dict[str, str]) -> None:
    text = serve_error("--http", "0", "--llm", "scripted", *args, env=env)
    assert "--token" in text and "printable ASCII" in text


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--token", ""], {}), ([], {"HYDE_PLUS_TOKEN": ""})],
    ids=["--token ''", "HYDE_PLUS_TOKEN=''"],
)
def test_serve_refuses_an_empty_token(args: list[str], env: dict[str, str]) -> None:
    assert "token is empty" in serve_error("--http", "0", "--llm", "scripted", *args, env=env)


def test_serve_warns_loudly_on_a_public_host_without_token() -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: warned, then refused
    text = serve_error("--http", "0", "--host", "192.0.2.1", "--llm", "scripted")
    assert "WARNING" in text and "WITHOUT a token" in text
    assert "error: 192.0.2.1 is not an address of this machine" in text and "127.0.0.1" in text


def test_serve_port_in_use_is_one_error_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        text = serve_error("--http", str(port), "--llm", "scripted")
    assert f"port {port} on 127.0.0.1 is already in use" in text and "another --http port" in text


@pytest.mark.parametrize("port", ["70000", "-1", "65536"])
def test_serve_port_out_of_range_is_one_error_line(port: str) -> None:
    text = serve_error("--http", port, "--llm", "scripted")
    assert f"port {port} is out of range" in text and "1-65535" in text


@pytest.mark.parametrize("value", ["0", "-1"])
def test_serve_refuses_a_timeout_that_is_not_positive(value: str) -> None:
    assert "--timeout must be > 0" in serve_error(
        "--http", "0", "--llm", "scripted", "--timeout", value
    )


@pytest.fixture(scope="module")
def served_300ms() -> Iterator[Served]:
    """``serve --http 0 --llm scripted:300`` on loopback, shared by the tests that each
    check their own calls and output; all it wrote is checked again when it stops."""
    served = Served("--llm", "scripted:300")
    yield served
    out = served.stop()
    no_traceback(out)
    assert "WARNING" not in out


@pytest.mark.slow  # a server in a subprocess
def test_serve_on_loopback_does_not_warn_and_its_banner_shows_the_timeout(
    served_300ms: Served,
) -> None:
    assert rcp.connect_http(served_300ms.url).ping() == {}
    out = served_300ms.output()
    assert "WARNING" not in out
    assert re.search(r"timeout: [\d.]+ s per LLM call \((local|remote) model policy\)", out), out


@pytest.mark.slow  # a server in a subprocess
def test_serve_on_ipv6_loopback_works_or_says_why() -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        has_ipv6 = True
    except OSError:
        has_ipv6 = False
    if not has_ipv6:
        assert "IPv6" in serve_error("--http", "0", "--host", "::1", "--llm", "scripted")
        return
    served = Served("--host", "::1", "--llm", "scripted")
    try:
        assert served.url.startswith("http://[::1]:")
        client = rcp.connect_http(served.url)
        assert client.transform("over IPv6", "rewrite")["queries"]
    finally:
        out = served.stop()
    no_traceback(out)


@pytest.mark.slow  # a server in a subprocess
def test_serve_timeout_bounds_each_llm_call() -> None:
    served = Served("--llm", "scripted:3000", "--timeout", "0.3")
    try:
        client = rcp.connect_http(served.url)
        start = time.perf_counter()
        out = client.call("query/transform", {"query": "slow model", "method": "rewrite"})
        assert out["fallback"] is True and out["queries"] == ["slow model"]
        assert time.perf_counter() - start < 2.5
    finally:
        out = served.stop()
    assert "timeout: 0.3 s per LLM call (--timeout)" in out


@pytest.mark.slow  # a server in a subprocess
def test_http_client_disconnect_mid_request_prints_no_traceback(served_300ms: Served) -> None:
    served = served_300ms
    client = rcp.connect_http(served.url)
    host, port = re.match(r"http://([^/]+):(\d+)/", served.url).groups()  # type: ignore[union-attr]
    for i in range(5):
        body = frame("query/transform", {"query": f"gone {i}", "method": "rewrite"})
        with socket.create_connection((host, int(port))) as s:
            s.sendall(
                b"POST /rcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body
            )
        # closed before the 300 ms reply
    time.sleep(1.0)
    assert client.transform("still serving", "rewrite")["queries"]
    assert served.proc.poll() is None
    no_traceback(served.output())


@pytest.mark.slow  # a stdio server in a subprocess
def test_stdio_client_gone_mid_request_prints_no_traceback() -> None:
    proc = subprocess.Popen(
        [*CLI, "--stdio", "--llm", "scripted:300"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(json.dumps(INIT).encode() + b"\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["result"]
    body = frame("query/transform", {"query": "q", "method": "rewrite"}, id_=2)
    proc.stdin.write(body + b"\n" + body + b"\n")
    proc.stdin.flush()
    proc.stdout.close()  # the client goes away before the reply
    time.sleep(1.0)
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    no_traceback(proc.stderr.read().decode())


def stdio_exchange(
    lines: list[bytes], *args: str
) -> tuple[list[dict], subprocess.CompletedProcess[bytes]]:
    proc = subprocess.run(
        [*CLI, "--stdio", "--llm", "scripted", *args],
        input=b"\n".join(lines) + b"\n",
        capture_output=True,
        timeout=120,
    )
    return [json.loads(line) for line in proc.stdout.splitlines()], proc


@pytest.mark.slow  # a stdio server in a subprocess
def test_stdio_survives_hostile_frames_and_answers_each() -> None:
    lines = [
        b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1e999}}',
        b'{"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {"nonce": '
        + b"[" * DEEP
        + b"]" * DEEP
        + b"}}",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"jsonrpc": "2.0", "id": 3, "method": "ping", "params": "nonce"}',
        b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}',
        json.dumps([INIT] * (MAX_BATCH + 1)).encode(),
        b'{"jsonrpc": "2.0", "id": 4, "method": "ping", "params": {"pad": "'
        + b"x" * (1 << 20)
        + b'"}}',
        b"\xff\xfe garbage \x00",
        b'{"jsonrpc": "2.0", "method": "initialize", "params": {"protocolVersion": 0}}',
        json.dumps(INIT).encode(),
        frame("query/transform", {"query": "q", "method": "rewrite"}, id_=5),
        frame("shutdown", id_=6),
    ]
    replies, proc = stdio_exchange(lines)
    codes = [r.get("error", {}).get("code") for r in replies]
    assert codes == [
        rcp.Errc.INVALID_PARAMS,  # 1e999
        rcp.Errc.INVALID_REQUEST,  # nested 600 deep
        rcp.Errc.PARSE_ERROR,  # nested 100,000 deep
        rcp.Errc.INVALID_PARAMS,  # params not an object
        rcp.Errc.INVALID_REQUEST,  # id not a scalar
        rcp.Errc.INVALID_REQUEST,  # batch over the limit
        rcp.Errc.PAYLOAD_TOO_LARGE,  # a line over 1 MiB
        rcp.Errc.PARSE_ERROR,  # garbage
        # the bogus initialize notification: no reply, and it changed nothing
        None,  # initialize
        None,  # transform
        None,  # shutdown
    ], replies
    assert replies[0]["id"] == 1 and replies[3]["id"] == 3
    assert replies[-2]["result"]["queries"] and replies[-1] == {
        "jsonrpc": "2.0",
        "id": 6,
        "result": {},
    }
    assert proc.returncode == 0
    no_traceback(proc.stderr.decode())


@pytest.fixture(scope="module")
def wide_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llama_index_hyde_plus.local import local_embedding

    out = tmp_path_factory.mktemp("rcp-wide") / "index"
    docs = [Document(text=text, id_=nid) for nid, text in DOCS.items()]
    docs += [
        Document(
            text=f"Memo {i}: the team reviewed item {i} of the quarterly plan.", id_=f"memo-{i}"
        )
        for i in range(40)
    ]
    build_faiss_index(docs, local_embedding(), out, embed_spec="local", max_length=256)
    return out


@pytest.mark.local
def test_retrieve_honours_k_up_to_max_k(wide_index: Path) -> None:
    client = rcp.connect_stdio([*CLI, "--stdio", "--index", str(wide_index), "--llm", "scripted"])
    try:
        assert client.capabilities["retrieve"]["maxK"] == 100
        assert len(client.retrieve("quarterly plan", k=25)) == 25
        assert len(client.retrieve("quarterly plan", k=3)) == 3
        hits = client.retrieve("quarterly plan", k=100, opts={"rewrite": "multi-query"})
        assert len(hits) == len(DOCS) + 40  # every document, not 10
        assert len(client.retrieve("quarterly plan", k=5000)) == len(DOCS) + 40  # clamped
    finally:
        client.shutdown()


@pytest.mark.local
def test_serve_local_warms_the_model_up_and_names_it() -> None:
    served = Served("--llm", "local", "--timeout", "30")
    try:
        # loaded (and one tiny call made) before the server accepts its first request,
        # so neither counts against the first searches' timeout
        banner = " ".join(served.banner.split())
        assert re.search(r"SmolLM2\S* loaded in [\d.]+ s RCP server on", banner), banner
        assert "llm: SmolLM2" in banner
    finally:
        served.stop()


@pytest.fixture
def passages_client(faiss_index: VectorStoreIndex) -> Iterator[rcp.Client]:
    """A client of a server whose LLM writes a different passage on every call."""
    replies = iter(f"Passage number {i} about revenue." for i in range(1, 100))
    llm = ScriptedLLM(respond=lambda prompt: next(replies))
    service = TransformService(llm, faiss_index.as_retriever(similarity_top_k=10))
    server = RcpHttpServer(build_server(service, http=True)).start()
    yield rcp.connect_http(server.url)
    server.stop()


def test_hyde_over_rcp_writes_n_passages_and_one_by_default(passages_client: rcp.Client) -> None:
    three = passages_client.call("query/transform", {"query": "q", "method": "hyde", "n": 3})
    assert three["hypothetical"].count("Passage number") == 3
    assert three["usage"]["llmCalls"] == 3
    one = passages_client.call("query/transform", {"query": "q2", "method": "hyde"})
    assert one["hypothetical"].count("Passage number") == 1
    found = passages_client.call(
        "retrieve", {"query": "q3", "rewrite": {"method": "hyde", "n": 2}, "k": 3}
    )
    assert found["usage"]["llmCalls"] == 2


@pytest.fixture
def condense_client() -> Iterator[tuple[rcp.Client, ScriptedLLM]]:
    def knows_pricing(prompt: str) -> str:
        return "What does the enterprise plan cost?" if "pro plan" in prompt else "plan"

    llm = ScriptedLLM(respond=knows_pricing)
    server = RcpHttpServer(build_server(TransformService(llm), http=True)).start()
    try:
        yield rcp.connect_http(server.url), llm
    finally:
        server.stop()


HISTORY_KEY = "x-hyde-plus/chatHistory"
PRICING_CHAT = [
    {"role": "user", "content": "How much is the pro plan?"},
    {"role": "assistant", "content": "20 dollars a month."},
]


def test_condense_reads_the_conversation_from_meta_and_advertises_the_key(
    condense_client: tuple[rcp.Client, ScriptedLLM],
) -> None:
    client, llm = condense_client
    assert client.capabilities["transform"]["x-hyde-plus"]["chatHistory"] == HISTORY_KEY
    params = {"query": "and for enterprise?", "method": "condense"}
    alone = client.call("query/transform", params)
    assert alone["queries"] == ["and for enterprise?"] and llm.prompts == []  # no call
    meta = {"_meta": {HISTORY_KEY: PRICING_CHAT, "x-other/ignored": 1}}
    condensed = client.call("query/transform", {**params, **meta})
    assert condensed["queries"] == ["What does the enterprise plan cost?"]
    assert "User: How much is the pro plan?" in llm.prompts[0]
    # another method ignores the conversation; an unknown _meta key breaks nothing
    assert client.call("query/transform", {"query": "q", "method": "rewrite", **meta})


@pytest.mark.parametrize(
    "history",
    [
        "How much?",
        [{"role": "system", "content": "x"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": "x"}] * 101,
        [{"role": "user", "content": "x" * 20_001}],
    ],
)
def test_a_bad_conversation_is_invalid_params_naming_the_field(
    condense_client: tuple[rcp.Client, ScriptedLLM], history: Any
) -> None:
    client, llm = condense_client
    params = {"query": "q", "method": "condense", "_meta": {HISTORY_KEY: history}}
    with pytest.raises(rcp.RcpError) as info:
        client.call("query/transform", params)
    assert int(info.value.code) == -32602 and HISTORY_KEY in str(info.value.data)
    assert llm.prompts == []
