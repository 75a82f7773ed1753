"""The RCP server, driven by the official `rcp` client over HTTP and stdio."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import rcp
from llama_index.core import Document, VectorStoreIndex

from llama_index_hyde_plus.indexing import build_faiss_index
from llama_index_hyde_plus.rcp import MAX_N, RcpHttpServer, TransformService, build_server
from llama_index_hyde_plus.testing import echo_llm

from .conftest import DOCS

METHODS = ["hyde", "multi-query", "step-back", "decompose", "rewrite"]


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
